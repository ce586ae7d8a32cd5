"""A real MLflow tracking server on loopback for tests: `mlflow server` from PyPI with a SQLite
backend, artifacts on disk and MLflow's basic-auth app (so wrong credentials are refused as a
real server refuses them).

The full server (Flask, FastAPI, SQLAlchemy, alembic, pandas, ...) is not in the product's lock:
bertflow logs through `mlflow-skinny`. It lives in a test-only environment kept outside the
checkout (tests/env_cache.py), installed with uv when it is there, else pip. Measured on this
2-core machine under load: `uv pip install "mlflow[auth]==3.17.2"` 11 s from an empty uv cache,
4 s from a warm one (683 MB of cache); the whole first build (venv, pip, install) 25 s. Later
sessions reuse it. Runnable as a script to build it ahead of the tests:
`python tests/mlflow_server.py` (with a folder argument it also serves until Ctrl-C).
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import requests

import env_cache
from storage_servers import free_port

# The newest full server that resolves on PyPI here (mlflow 3.18.0 needs an mlflow-tracing
# 3.18.0 that is not published); [auth] brings Flask-WTF for the basic-auth app.
SERVER = "mlflow[auth]==3.17.2"
ADMIN = "admin"
PASSWORD = "bertflow-test-admin-pw"  # a throwaway server's bootstrap admin


def python() -> Path:
    """The server environment's interpreter, built if missing."""
    def install(interpreter: Path) -> None:
        uv = Path(sys.executable).parent / "uv"
        command = ([str(uv), "pip", "install", "--quiet", "--python", str(interpreter)]
                   if uv.exists() else [str(interpreter), "-m", "pip", "install", "--quiet"])
        done = subprocess.run([*command, SERVER], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"installing {SERVER} failed:\n{done.stderr[-3000:]}")

    return env_cache.venv("mlflow-server", SERVER, install)


@dataclass(frozen=True)
class Server:
    url: str
    folder: Path
    log: Path

    def api(self, path: str, **params):
        """GET /api/2.0/mlflow/{path} as the admin, JSON."""
        resp = requests.get(f"{self.url}/api/2.0/mlflow/{path}", params=params,
                            auth=(ADMIN, PASSWORD), timeout=60)
        resp.raise_for_status()
        return resp.json()


@contextlib.contextmanager
def serving(folder: Path, timeout: float = 300) -> Iterator[Server]:
    """`mlflow server` (one worker) on a free loopback port until the block ends."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = folder / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PYTHONPATH"))}
    env.update(MLFLOW_AUTH_ADMIN_PASSWORD=PASSWORD, MLFLOW_FLASK_SERVER_SECRET_KEY="test-only",
               # No job runner: it starts a Huey consumer process per job kind, each importing
               # mlflow (CPU the tests, which log runs and versions, never use).
               MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    with open(log, "w") as out:
        # cwd: the basic-auth app keeps its users in ./basic_auth.db.
        process = subprocess.Popen(
            [str(python()), "-m", "mlflow", "server", "--app-name", "basic-auth",
             "--workers", "1", "--host", "127.0.0.1", "--port", str(port),
             "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
             "--artifacts-destination", str(folder / "artifacts")],
            cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"mlflow server exited {process.returncode}:\n"
                                   f"{log.read_text()[-3000:]}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{url}/health", timeout=5).ok:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server not up in {timeout:.0f} s:\n"
                                   f"{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield Server(url, folder, log)
    finally:
        _stop(process)


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM to the server and its uvicorn worker; uvicorn then waits for open connections
    and background tasks (the module's teardown took 31 s), so a second SIGTERM after 5 s
    forces its quit, and SIGKILL ends what is left: the server's files are the test's own."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGTERM, 10), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


if __name__ == "__main__":
    print(python())
    if len(sys.argv) > 1:  # python tests/mlflow_server.py FOLDER: serve until Ctrl-C
        with serving(Path(sys.argv[1])) as server:
            print(server.url, flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
