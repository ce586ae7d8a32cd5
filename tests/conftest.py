"""Shared fixtures.

Airflow reads its configuration when first imported, so AIRFLOW_HOME and friends are set here,
at collection time, before any test module imports Airflow: the suite never touches
~/airflow or the project's .airflow/ folder.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

_AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="bertflow-test-airflow-"))
os.environ.update({
    "AIRFLOW_HOME": str(_AIRFLOW_HOME),
    "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
    "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_ROOT / "plugins"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "TF_USE_LEGACY_KERAS": "1",
})
# The rest of TensorFlow's settings of every bertflow process (oneDNN), before any test module
# imports TensorFlow.
import tasks  # noqa: E402,F401


@pytest.fixture
def artifact_root(tmp_path, monkeypatch) -> str:
    """A fresh artifact root, also the RunConfig default for code that reads the env."""
    root = tmp_path / "artifacts"
    root.mkdir()
    monkeypatch.setenv("BERTFLOW_ARTIFACT_ROOT", str(root))
    return str(root)


@pytest.fixture(scope="session", autouse=True)
def warm_start_server(tmp_path_factory):
    """One warm-start server per test process (tasks/provision/local/warm_start.py), as `make demo`
    runs one: LocalCluster forks its step processes from it instead of importing TensorFlow
    in each. Tests that need a cold start unset BERTFLOW_WARM_SOCKET; BERTFLOW_TEST_COLD=1
    runs a whole session without a server (to compare, or where no step process starts)."""
    from tasks.provision.local import warm_start

    if os.environ.get("BERTFLOW_TEST_COLD") == "1":
        yield None
        return
    log = tmp_path_factory.getbasetemp() / "warm_start.log"
    with warm_start.serving(log_path=log) as path:
        os.environ[warm_start.SOCKET_ENV] = str(path)
        yield {"socket": path, "log": log}
        os.environ.pop(warm_start.SOCKET_ENV, None)


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """AIRFLOW_HOME with a migrated SQLite metadata DB, made once per session."""
    subprocess.run([str(Path(PYTHON).parent / "airflow"), "db", "migrate"], check=True,
                   capture_output=True, env=os.environ.copy())
    return _AIRFLOW_HOME


def pytest_collection_finish(session):
    """Start the network-bound lock resolution early when this session runs it (see
    tests/lock_checks.py); a registry error is left for the test to report. Under
    pytest-xdist every worker collects every test, so there the test's fixture starts it, on
    the one worker that runs the file."""
    import lock_checks

    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if any(item.name.startswith(lock_checks.TEST_NAME) for item in session.items):
        try:
            lock_checks.start()
        except lock_checks.resolve.RegistryError:
            pass


def pytest_sessionfinish(session, exitstatus):
    import lock_checks

    lock_checks.stop()
    shutil.rmtree(_AIRFLOW_HOME, ignore_errors=True)


# Wall time per test file (setup, call and teardown of its tests, module fixtures included).
# Files run whole on one xdist worker (--dist loadfile), so the largest of these bound the
# suite's wall time: the list says where shortening the suite pays.
_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    if not _FILE_SECONDS or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    slowest = sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:15]
    terminalreporter.write_sep("=", "slowest test files (seconds, module fixtures included)")
    for path, seconds in slowest:
        terminalreporter.write_line(f"{seconds:8.1f}  {path}")
    total = sum(_FILE_SECONDS.values())
    terminalreporter.write_line(f"{total:8.1f}  all files, summed over workers")
    if os.environ.get("BERTFLOW_FILE_SECONDS"):  # every file, for docs/development.md's table
        Path(os.environ["BERTFLOW_FILE_SECONDS"]).write_text(json.dumps(
            dict(sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])), indent=1))
