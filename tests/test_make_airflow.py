"""`make airflow`: the README's third command, run as a user would, on a free port and a
throwaway AIRFLOW_HOME. It prints the URL and the generated login; that login gets a JWT from
the REST API; bert_finetune triggered with a tiny conf on the demo data is accepted and its
tasks run (validate succeeds, so the execution API is reached on the non-default port); then
Ctrl-C (SIGINT to make's process group, as a terminal sends it) stops everything: make exits,
and no process started for it is left, including the task's TensorFlow workers.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from ui_helpers import PROJECT_ROOT, free_port

DAG_ID = "bert_finetune"
TINY = {"max_steps": 2, "max_seq_length": 32, "epochs": 1, "per_replica_batch_size": 8,
        "num_shards": 1}
LOGIN = re.compile(r"log in as '([^']+)' with password '([^']+)'")


def _pids_with_env(marker: bytes) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


class MakeAirflow:
    def __init__(self, home: Path, artifacts: Path):
        self.home, self.port = home, free_port()
        self.base = f"http://localhost:{self.port}"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("AIRFLOW__", "MAKE", "MFLAGS")) and k != "PYTHONPATH"}
        env["BERTFLOW_ARTIFACT_ROOT"] = str(artifacts)
        self.proc = subprocess.Popen(
            ["make", "--no-print-directory", "airflow", f"PORT={self.port}",
             f"AIRFLOW_HOME={home}"], cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, pattern: re.Pattern, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if match := pattern.search(line):
                    return match
            if self.proc.poll() is not None:
                raise AssertionError(f"make airflow exited with {self.proc.returncode}:\n"
                                     + self.output)
            time.sleep(1)
        raise AssertionError(f"no line matching {pattern.pattern!r} after {timeout:.0f}s:\n"
                             + self.output)

    def interrupt(self, timeout: float = 120) -> int:
        """Ctrl-C: SIGINT to the whole foreground group (make and the launcher)."""
        os.killpg(self.proc.pid, signal.SIGINT)
        return self.proc.wait(timeout=timeout)

    def kill(self):
        """Finalizer for a failed test: nothing may outlive it."""
        with_home = f"AIRFLOW_HOME={self.home}".encode()
        for pid in _pids_with_env(with_home):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)


@pytest.fixture
def make_airflow(tmp_path):
    home, artifacts = tmp_path / "airflow-home", tmp_path / "artifacts"
    home.mkdir()
    artifacts.mkdir()
    ui = MakeAirflow(home, artifacts)
    try:
        yield ui
    finally:
        if ui.proc.poll() is None or _pids_with_env(f"AIRFLOW_HOME={home}".encode()):
            print("make airflow output:\n" + ui.output)
            ui.kill()


def test_make_airflow_serves_the_ui_runs_tasks_and_stops_on_ctrl_c(make_airflow):
    ui = make_airflow
    started = time.monotonic()
    ui.wait_for_line(re.compile(re.escape(f"Airflow is up: {ui.base}")), timeout=420)
    user, password = ui.wait_for_line(LOGIN, timeout=10).groups()
    print(f"\nmake airflow ready after {time.monotonic() - started:.0f}s")
    generated = ui.home / "simple_auth_manager_passwords.json.generated"
    assert json.loads(generated.read_text()) == {user: password}

    resp = httpx.post(f"{ui.base}/auth/token", json={"username": user, "password": password},
                      timeout=60)
    assert resp.status_code in (200, 201), resp.text
    headers = {"Authorization": f"Bearer {resp.json()['access_token']}"}

    def api(method, path, **kwargs):
        return httpx.request(method, f"{ui.base}/api/v2{path}", headers=headers, timeout=60,
                             **kwargs)

    deadline = time.monotonic() + 240
    while api("GET", f"/dags/{DAG_ID}").status_code != 200:
        assert time.monotonic() < deadline, "bert_finetune never parsed\n" + ui.output
        time.sleep(2)
    assert api("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False}).status_code == 200
    resp = api("POST", f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": TINY})
    assert resp.status_code == 200, resp.text
    run = resp.json()
    assert run["state"] in ("queued", "running"), run
    quoted = quote(run["dag_run_id"], safe="")

    # Tasks really run: validate succeeds (the execution API answers on this port) and a
    # worker step starts, so Ctrl-C has task processes and TensorFlow workers to stop.
    deadline = time.monotonic() + 300
    while True:
        tis = {ti["task_id"]: ti["state"] for ti in api(
            "GET", f"/dags/{DAG_ID}/dagRuns/{quoted}/taskInstances").json()["task_instances"]}
        if tis.get("validate") == "success" and tis.get("prepare_data") == "success" and \
                tis.get("tokenize") in ("running", "success"):
            break
        assert "failed" not in tis.values(), tis
        assert time.monotonic() < deadline, f"tasks did not start: {tis}\n{ui.output}"
        time.sleep(2)
    assert api("GET", f"/dags/{DAG_ID}/dagRuns/{quoted}").json()["state"] == "running"
    before = _pids_with_env(f"AIRFLOW_HOME={ui.home}".encode())
    assert len(before) >= 4, before  # standalone + its components (+ task processes)

    stopping = time.monotonic()
    rc = ui.interrupt()
    print(f"stopped {time.monotonic() - stopping:.0f}s after Ctrl-C (make exit {rc})")
    ui._reader.join(timeout=10)
    assert "Stopped; no Airflow process left." in ui.output, ui.output
    left = _pids_with_env(f"AIRFLOW_HOME={ui.home}".encode())
    assert left == [], left
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{ui.base}/api/v2/monitor/health", timeout=5)
