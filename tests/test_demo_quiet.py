"""`make demo`'s console output: one progress line per task (task, state, seconds), Airflow's
and the tasks' full log in a file. The progress comes from the metadata DB during a real
dag.test() of bert_finetune; here only `validate` really runs and the other tasks are marked
successful (dag.test's mark_success_pattern), so the check takes seconds. The whole demo
config runs end to end in tests/test_dag_e2e.py.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from bertflow_airflow.demo import output_to, progress_line

PROJECT_ROOT = Path(__file__).resolve().parent.parent

TASKS = ["validate", "prepare_data", "tokenize", "provision", "train", "evaluate", "release",
         "export", "gate_eval", "gate", "approval", "log_to_mlflow", "promote"]
LINE = re.compile(r"^  (?P<task>\w+) +(?P<state>\w+) +(?P<seconds>\d+\.\d|-) s(  \(try \d+\))?$")


def test_progress_line_shape():
    assert progress_line("train", "success", 42.345) == "  train          success            42.3 s"
    assert LINE.match(progress_line("tokenize", "up_for_retry", 3.0, try_number=2))
    assert LINE.match(progress_line("export", "success", None))


def test_output_to_sends_python_fd_and_child_output_to_the_log(tmp_path, capfd):
    log = tmp_path / "demo.log"
    with output_to(log) as console:
        print("from python")
        os.write(1, b"from fd 1\n")
        os.write(2, b"from fd 2\n")
        subprocess.run(["echo", "from a child"], check=True)
        print("progress", file=console, flush=True)
    print("after")
    text = log.read_text()
    for needle in ("from python", "from fd 1", "from fd 2", "from a child"):
        assert needle in text
    out, err = capfd.readouterr()
    assert "progress" in out and "after" in out
    assert "from" not in out + err


def test_the_ui_session_s_processes_are_found_by_their_environment():
    """`make airflow`'s Ctrl-C stops every process of its session, also those in their own
    process groups (task workers): they are found by a variable in their environment."""
    from bertflow_airflow.demo import _pids_with

    marker = f"BERTFLOW_UI_SESSION=test-{os.getpid()}"
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    mine = subprocess.Popen(sleep, env={**os.environ, "BERTFLOW_UI_SESSION": marker[20:]},
                            start_new_session=True)
    other = subprocess.Popen(sleep, env={**os.environ, "BERTFLOW_UI_SESSION": "another"})
    try:
        assert _pids_with(marker.encode()) == [mine.pid]
    finally:
        for proc in (mine, other):
            proc.kill()
            proc.wait()
    assert _pids_with(marker.encode()) == []


QUIET_RUN = """
import sys
from pathlib import Path
from bertflow_airflow.demo import run_dag_quietly
dag_run = run_dag_quietly({"artifact_root": sys.argv[1]}, Path(sys.argv[2]),
                          mark_success_pattern=r"(?!validate$).*")  # progress: the console
print("STATE", dag_run.state)
"""


def test_quiet_dag_run_prints_one_line_per_task(airflow_db, artifact_root, tmp_path):
    """In a fresh process, as `make demo` runs it (pytest's own log capture would otherwise
    take Airflow's records before they reach the redirected output)."""
    log = tmp_path / "logs" / "demo.log"
    done = subprocess.run([sys.executable, "-c", QUIET_RUN, artifact_root, str(log)],
                          capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    *lines, state = done.stdout.splitlines()
    assert state == "STATE success"
    parsed = [LINE.match(line) for line in lines]
    assert all(parsed), lines
    assert sorted(m["task"] for m in parsed) == sorted(TASKS), lines
    assert {m["state"] for m in parsed} == {"success"}, lines
    assert lines[0].split()[0] == "validate"  # in the order they finished
    validate = next(m for m in parsed if m["task"] == "validate")
    assert validate["seconds"] != "-" and float(validate["seconds"]) > 0
    # Airflow's own log went to the file, not to the console.
    text = log.read_text()
    assert "[DAG TEST]" in text and "validate" in text
    assert "[DAG TEST]" not in done.stdout + done.stderr
