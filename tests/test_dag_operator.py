"""The DAG's worker controller operator against real processes (tiny scripts, no TensorFlow):
it fails with the worker's error and on_kill stops every worker, keeping their logs."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tasks.provision.local.backend import pid_record_uri
from tasks.provision.local.cluster import local_tmp_root
from tasks.provision.spec import WorkerSpec
from tasks.io import storage
from tasks.runs.runlayout import init_run
from tasks.config import parse_config
from tasks.errors import WorkerError
from tasks.steps import release
from tasks.runs.runlayout import RunContext

DAGS = Path(__file__).resolve().parent.parent / "dags"


@pytest.fixture(scope="module")
def operator_class():
    from airflow.dag_processing.dagbag import DagBag

    return type(DagBag(dag_folder=str(DAGS)).dags["bert_finetune"].get_task("train"))


@pytest.fixture
def run_with_worker(artifact_root, tmp_path):
    """A run folder whose provisioned 'train' workers run the given script."""
    ctx = RunContext(artifact_root, "bert_finetune", "manual_op", "manual_op")
    cfg = parse_config({"artifact_root": artifact_root})
    init_run(cfg, ctx)

    def make(script: str) -> str:
        path = tmp_path / "worker.py"
        path.write_text(script)
        spec = WorkerSpec(command=["python", str(path)], cluster={"worker": 2},
                                    strategy="multi_worker_mirrored")
        storage.write_json(ctx.manifest_uri("provision"), {"workers": {"train": spec.to_dict()}})
        return ctx.run_uri

    yield make
    release.run(cfg, ctx)  # the teardown step removes the workers' scratch folders
    assert not local_tmp_root(ctx.run_uri).exists()


def test_worker_failure_fails_the_task_with_its_error(operator_class, run_with_worker):
    run_uri = run_with_worker("import sys; sys.exit('DataError: train.tsv, line 7: no label')")
    op = operator_class(task_id="train", step="train", run_uri=run_uri, distributed=True)
    with pytest.raises(WorkerError, match="exited with code 1: DataError: train.tsv, line 7"):
        op.execute(context={})


def test_on_kill_stops_the_workers(operator_class, run_with_worker):
    run_uri = run_with_worker(
        "import os, pathlib, time; print('ready', flush=True); "
        "pathlib.Path(os.environ['TMPDIR'], 'ready').touch(); time.sleep(600)")
    op = operator_class(task_id="train", step="train", run_uri=run_uri, distributed=True)
    errors = []

    def execute():
        try:
            op.execute(context={})
        except WorkerError as err:
            errors.append(err)

    runner = threading.Thread(target=execute)
    runner.start()
    record_uri = pid_record_uri(run_uri, "train")
    ready = [local_tmp_root(run_uri) / f"worker-{i}" / "ready" for i in (0, 1)]
    deadline = time.monotonic() + 60
    while not all(p.exists() for p in ready) and time.monotonic() < deadline:
        time.sleep(0.05)
    op.on_kill()
    runner.join(timeout=30)
    assert not runner.is_alive() and "stopped" in str(errors[0])
    # Both workers were killed and reaped by the controller.
    pids = [entry["pid"] for entry in storage.read_json(record_uri)["pids"]]
    assert len(pids) == 2 and not any(Path(f"/proc/{pid}").exists() for pid in pids)
    # Their output is kept in the run folder (tasks/provision/worker_logs.py).
    for index in (0, 1):
        assert storage.read_text(f"{run_uri}/train/logs/worker-{index}.log") == "ready\n"
