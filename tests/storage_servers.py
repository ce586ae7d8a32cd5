"""Real storage servers on loopback for tests: the GCS emulator and moto's S3 server.

Import the fixtures into a test module (`from storage_servers import ...`). Both servers run
in this process on free ports for the whole session; each test gets its own prefix.
GCS is reached the ambient way (`STORAGE_EMULATOR_HOST`, anonymous); S3 through an Airflow
connection (`AIRFLOW_CONN_BERTFLOW_S3`, with a secret the tests scan written files for).
"""
from __future__ import annotations

import json
import os
import socket
import uuid
from http import HTTPStatus

import pytest

from tasks.io import storage

BUCKET = "bertflow-test"
S3_CONN_ID = "bertflow_s3"
S3_KEY_ID = "AKIABERTFLOWTEST0001"
S3_SECRET = "bertflow-test-secret-9f3a7c1e5d"  # must never appear in written files


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _enforce_generation_preconditions() -> None:
    """gcp-storage-emulator ignores `ifGenerationMatch`, which real GCS enforces and which
    the champion pointer and `_COMPLETE.json` rely on. Add that one check to its upload
    handler (the narrowest place; its single-threaded server makes check-then-write
    atomic, as the real service's precondition is)."""
    from gcp_storage_emulator import server
    from gcp_storage_emulator.exceptions import NotFound
    from gcp_storage_emulator.handlers import objects

    original = objects.insert

    def insert(request, response, storage_, *args, **kwargs):
        expected = request.query.get("ifGenerationMatch")
        if expected:
            name = (request.query.get("name") or [None])[0]
            if name is None and isinstance(request.data, dict):
                name = request.data.get("meta", {}).get("name")
            try:
                current = storage_.get_file_obj(request.params["bucket_name"], name)
                generation = current["generation"]
            except NotFound:
                generation = "0"
            if generation != expected[0]:
                response.status = HTTPStatus.PRECONDITION_FAILED
                response.json({"error": {"code": 412, "message": "Precondition Failed"}})
                return
        return original(request, response, storage_, *args, **kwargs)

    for _, handlers in server.HANDLERS:
        for method, handler in handlers.items():
            if handler is original:
                handlers[method] = insert
    objects.insert = insert  # the router's fallback for uploads without /upload prefix


@pytest.fixture(scope="session")
def gcs_emulator():
    """Endpoint URL of an in-memory GCS emulator with bucket BUCKET."""
    from gcp_storage_emulator.server import create_server

    _enforce_generation_preconditions()
    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    previous = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    yield endpoint
    server.stop()
    if previous is None:
        os.environ.pop("STORAGE_EMULATOR_HOST", None)
    else:
        os.environ["STORAGE_EMULATOR_HOST"] = previous


@pytest.fixture(scope="session")
def s3_server():
    """Endpoint URL of moto's S3 server with bucket BUCKET, plus an Airflow connection
    S3_CONN_ID (in the environment) pointing at it."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    env_name = f"AIRFLOW_CONN_{S3_CONN_ID.upper()}"
    os.environ[env_name] = json.dumps({
        "conn_type": "aws", "login": S3_KEY_ID, "password": S3_SECRET,
        "extra": {"endpoint_url": endpoint, "region_name": "us-east-1"}})
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                 aws_access_key_id=S3_KEY_ID, aws_secret_access_key=S3_SECRET
                 ).create_bucket(Bucket=BUCKET)
    yield endpoint
    os.environ.pop(env_name, None)
    server.stop()


@pytest.fixture
def connections():
    """Route s3:// through the test Airflow connection; gs:// stays ambient."""
    storage.configure(storage.Connections(aws_conn_id=S3_CONN_ID))
    yield
    storage.configure(storage.Connections())


@pytest.fixture(params=["file", "gs", "s3"])
def root(request, tmp_path, connections):
    """A fresh, empty root URI on each backend."""
    if request.param == "file":
        return str(tmp_path / "store")
    request.getfixturevalue("gcs_emulator" if request.param == "gs" else "s3_server")
    return f"{request.param}://{BUCKET}/{uuid.uuid4().hex[:12]}"
