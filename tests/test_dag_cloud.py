"""bert_finetune with its data and model on the storage emulators; credentials for worker
processes; the asset-triggered retraining DAG.

Both scenarios' DAG runs go through dag.test() in one child process (tests/dag_child.py) whose
output is the Airflow task logs (dag.test writes no log files), so the logs can be scanned for
secrets. Connections are
AIRFLOW_CONN_* variables: S3 (moto) with a key pair, GCS (emulator) with an endpoint extra.
The tiny random model (tests/train_helpers.py): storage is under test here, not the checkpoint
(tests/test_dag_e2e.py runs the whole DAG on the real one).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from storage_servers import (BUCKET, S3_CONN_ID, S3_KEY_ID, S3_SECRET,  # noqa: F401
                             gcs_emulator, s3_server)
from tasks.io import storage
from tasks.config import DEMO_DIR, PROJECT_ROOT, parse_config
from tasks.io.uris import join_uri
from bertflow_airflow.demo import DAG_ID, predict_in_fresh_process, run_folder, sample_rows
from dag_child import TASKS, TINY, finished_run, run_dags
from tasks.errors import ConfigError
from train_helpers import tiny_model_dir  # noqa: F401  (fixture)

GCS_CONN_ID = "bertflow_gcs"
# Stands for a credential of the GCS connection (the emulator needs none): it travels with
# the connection, so it must not show up anywhere either.
GCS_TOKEN = "bertflow-gcs-token-4be81f0a9c"
SECRETS = (S3_SECRET, GCS_TOKEN)

# Each scenario: where the data is and how train_uri names it, where the model is exported,
# where the run folders live.
SCENARIOS = {
    "s3-data-prefix_gcs-model_local-runs": ("s3", "train/", "gs", None),
    "gcs-data-glob_s3-model_gcs-runs": ("gs", "train/part-*.tsv", "s3", "gs"),
}

@pytest.fixture(scope="module")
def gcs_connection(gcs_emulator):  # noqa: F811
    name = f"AIRFLOW_CONN_{GCS_CONN_ID.upper()}"
    os.environ[name] = json.dumps({
        "conn_type": "google_cloud_platform", "password": GCS_TOKEN,
        "extra": {"endpoint_url": gcs_emulator, "project": "bertflow-test"}})
    yield GCS_CONN_ID
    os.environ.pop(name, None)


def _upload_demo_data(base: str) -> None:
    """The demo training set as two part files (plus a job marker), and its eval file."""
    header, *rows = (DEMO_DIR / "train.tsv").read_text().splitlines(keepends=True)
    half = len(rows) // 2
    storage.write_text(f"{base}/train/part-0.tsv", header + "".join(rows[:half]))
    storage.write_text(f"{base}/train/part-1.tsv", header + "".join(rows[half:]))
    storage.write_text(f"{base}/train/_SUCCESS", "")
    storage.write_text(f"{base}/eval.tsv", (DEMO_DIR / "eval.tsv").read_text())


def _scenario_conf(name: str, prefix: str, tmp: Path, model_dir: Path) -> dict:
    """The scenario's data uploaded under its own bucket prefix, and its run's conf."""
    data_scheme, train_name, export_scheme, root_scheme = SCENARIOS[name]
    data = f"{data_scheme}://{BUCKET}/{prefix}/data"
    _upload_demo_data(data)
    root = f"{root_scheme}://{BUCKET}/{prefix}/artifacts" if root_scheme else str(tmp / "art")
    return {**TINY, "train_uri": f"{data}/{train_name}", "eval_uri": f"{data}/eval.tsv",
            "export_uri": f"{export_scheme}://{BUCKET}/{prefix}/models",
            "artifact_root": root, "gcp_conn_id": GCS_CONN_ID, "aws_conn_id": S3_CONN_ID,
            "base_model": str(model_dir)}


@pytest.fixture(scope="module")
def cloud_runs(airflow_db, s3_server, gcs_connection,  # noqa: F811
               tiny_model_dir, tmp_path_factory):  # noqa: F811
    """Every scenario's DAG run, by scenario, all in one child process (one Airflow import
    and DAG parse, not one per scenario), each with its own bucket prefix and the part of the
    child's output its run printed."""
    storage.configure(storage.Connections(GCS_CONN_ID, S3_CONN_ID))
    prefixes = {name: uuid.uuid4().hex[:12] for name in SCENARIOS}
    confs = {name: _scenario_conf(name, prefixes[name], tmp_path_factory.mktemp("cloud-run"),
                                  tiny_model_dir) for name in SCENARIOS}
    output, parts = run_dags(confs)
    runs = {}
    for name, conf in confs.items():
        dag_run = finished_run(name, parts[name], output)
        runs[name] = SimpleNamespace(
            dag_run=dag_run, run_uri=run_folder(dag_run, conf["artifact_root"]), conf=conf,
            cfg=parse_config(conf), prefix=prefixes[name], log=parts[name], output=output)
    yield runs
    storage.configure(storage.Connections())


@pytest.fixture(scope="module", params=list(SCENARIOS))
def cloud_run(request, cloud_runs):
    return cloud_runs[request.param]


def test_every_task_succeeds(cloud_run):
    from airflow.models import DagRun, TaskInstance
    from airflow.utils.session import create_session

    run_id = cloud_run.dag_run.run_id
    with create_session() as session:
        states = dict(session.query(TaskInstance.task_id, TaskInstance.state)
                      .filter_by(dag_id=DAG_ID, run_id=run_id))
        run_state = session.query(DagRun.state).filter_by(dag_id=DAG_ID,
                                                          run_id=run_id).scalar()
    assert states == {**dict.fromkeys(TASKS, "success"), "approval": "skipped"}, \
        cloud_run.log[-5000:]
    assert run_state == "success"


def test_training_data_came_from_every_file_in_the_bucket(cloud_run):
    data = storage.read_json(join_uri(cloud_run.run_uri, "data", "manifest.json"))
    files = [f["uri"] for f in data["sources"]["train"]["files"]]
    base = cloud_run.conf["train_uri"].rsplit("train/", 1)[0]
    assert files == [f"{base}train/part-0.tsv", f"{base}train/part-1.tsv"]
    assert data["sources"]["eval"]["uri"] == cloud_run.conf["eval_uri"]


def test_published_model_in_the_bucket_predicts_and_is_champion(cloud_run):
    exported = storage.read_json(join_uri(cloud_run.run_uri, "export", "manifest.json"))
    version_uri = exported["version_uri"]
    assert version_uri.startswith(cloud_run.conf["export_uri"] + "/")
    assert storage.is_complete(version_uri)
    labels = storage.read_json(join_uri(version_uri, "labels.json"))
    rows = sample_rows(cloud_run.run_uri, count=2)
    with storage.staged_local_dir(join_uri(version_uri, "saved_model")) as path:
        predictions = predict_in_fresh_process(str(path), rows)
    assert len(predictions) == 2 and all(p["label"] in labels for p in predictions)
    champion = storage.read_json(join_uri(cloud_run.cfg.resolved_export_uri(),
                                          cloud_run.cfg.model_name, "CHAMPION.json"))
    assert champion["version_uri"] == version_uri


def test_no_secret_in_run_folder_bucket_objects_or_task_logs(cloud_run, airflow_db):
    assert "[worker:0]" in cloud_run.log  # the scenario's part holds its task logs
    logs = {str(p): p.read_bytes() for p in (airflow_db / "logs").rglob("*") if p.is_file()}
    # The child's whole output: both runs' task logs, and what it printed before either
    logs["dag.test output"] = cloud_run.output.encode()
    uris = {*storage.list_uris(cloud_run.run_uri), *(
        uri for scheme in ("gs", "s3")
        for uri in storage.list_uris(f"{scheme}://{BUCKET}/{cloud_run.prefix}"))}
    assert len(uris) > 20
    for name, content in [*logs.items(), *((u, storage.read_bytes(u)) for u in sorted(uris))]:
        for secret in SECRETS:
            assert secret.encode() not in content, f"{secret[:8]}... found in {name}"


# --- credentials for worker processes --------------------------------------------------------
READ_IN_WORKER = """
import sys
from tasks.io import storage
storage.configure(storage.Connections(aws_conn_id=sys.argv[1]))
print(storage.read_text(sys.argv[2]))
"""


def test_worker_env_carries_a_metadata_db_connection_to_a_worker(
        airflow_db, s3_server, monkeypatch):  # noqa: F811
    """The connection exists only in the metadata DB; the worker gets it from worker_env."""
    from airflow.models import Connection
    from airflow.utils.session import create_session

    from tasks.io import credentials

    conn_id = f"s3_db_{uuid.uuid4().hex[:6]}"
    with create_session() as session:
        session.add(Connection(conn_id=conn_id, conn_type="aws", login=S3_KEY_ID,
                               password=S3_SECRET, extra=json.dumps(
                                   {"endpoint_url": s3_server, "region_name": "us-east-1"})))
    # Outside a task, the SDK reads the metadata DB only in a server context; a controller
    # task gets the same connection from the API server.
    monkeypatch.setenv("_AIRFLOW_PROCESS_CONTEXT", "server")
    env = credentials.worker_env(parse_config({"aws_conn_id": conn_id}))
    assert list(env) == [f"AIRFLOW_CONN_{conn_id.upper()}"]

    uri = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}/hello.txt"
    storage.configure(storage.Connections(aws_conn_id=S3_CONN_ID))
    try:
        storage.write_text(uri, "hello from the bucket")
    finally:
        storage.configure(storage.Connections())
    bare = {k: v for k, v in os.environ.items()
            if not k.startswith("AIRFLOW_CONN_") and k != "_AIRFLOW_PROCESS_CONTEXT"}

    def worker(extra_env):
        return subprocess.run([sys.executable, "-c", READ_IN_WORKER, conn_id, uri],
                              env={**bare, **extra_env}, cwd=PROJECT_ROOT,
                              capture_output=True, text=True, timeout=300)

    without = worker({})
    assert without.returncode != 0 and f"'{conn_id}' is not defined" in without.stderr
    done = worker(env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "hello from the bucket"


def test_worker_env_is_empty_for_ambient_credentials_and_names_a_missing_connection():
    from tasks.io import credentials

    assert credentials.worker_env(parse_config({})) == {}
    with pytest.raises(ConfigError, match="gcp_conn_id.*'no_such_conn' is not defined"):
        credentials.worker_env(parse_config({"gcp_conn_id": "no_such_conn"}))


# --- asset-triggered retraining -------------------------------------------------------------
@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(PROJECT_ROOT / "dags"))
    assert bag.import_errors == {}
    return bag


def test_retrain_dag_is_scheduled_on_the_data_asset_and_triggers_bert_finetune(dagbag):
    from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
    from airflow.sdk import Asset

    dag = dagbag.dags["bert_retrain_on_data"]
    assert list(dag.timetable.asset_condition.objects) == [
        Asset("bertflow-training-data", uri="bertflow://training-data")]
    trigger = dag.get_task("trigger_bert_finetune")
    assert isinstance(trigger, TriggerDagRunOperator)
    assert trigger.trigger_dag_id in dagbag.dags
    assert trigger.upstream_task_ids == {"data_conf"}


def test_retrain_conf_comes_from_the_newest_event(dagbag):
    from datetime import datetime

    from airflow.sdk import Asset

    conf_of = dagbag.dags["bert_retrain_on_data"].get_task("data_conf").python_callable
    asset = Asset("bertflow-training-data", uri="bertflow://training-data")

    def events(*extras):
        return {"triggering_asset_events": {asset: [
            SimpleNamespace(timestamp=datetime(2024, 1, day), extra=extra)
            for day, extra in enumerate(extras, start=1)][::-1]}}  # order must not matter

    assert conf_of(**events({"train_uri": "s3://b/old/"}, {"train_uri": "s3://b/new/"})) == {
        "train_uri": "s3://b/new/", "test_uri": "", "validation_uri": ""}
    assert conf_of(**events({"train_uri": "gs://b/*.csv", "eval_uri": "gs://b/e.csv"})) == {
        "train_uri": "gs://b/*.csv", "test_uri": "gs://b/e.csv", "validation_uri": ""}
    assert conf_of(**events({"train_uri": "gs://b/t/", "test_uri": "gs://b/golden.csv",
                             "validation_uri": "gs://b/dev.csv"})) == {
        "train_uri": "gs://b/t/", "test_uri": "gs://b/golden.csv",
        "validation_uri": "gs://b/dev.csv"}
    with pytest.raises(ValueError, match="no 'train_uri'"):
        conf_of(**events({"path": "s3://b/x/"}))
