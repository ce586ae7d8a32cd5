"""bert_finetune's DAG runs through dag.test() in a child process, for the DAG tests
(test_dag_cloud, test_dag_kubernetes, test_dag_validate_checkpoint).

A child, not the test process: dag.test writes no log files, so the child's output is the task
logs the tests read (e.g. to scan for secrets). One child runs several DAG runs in turn when a
test file has several (one Airflow import and DAG parse, not one per run); a line before each
run splits the output by run.
"""
from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

from tasks.config import PROJECT_ROOT

# A tiny training run: the DAG's wiring is under test, not the model.
TINY = {"max_seq_length": 32, "epochs": 1, "max_steps": 3, "per_replica_batch_size": 8,
        "num_shards": 1, "num_workers": 1, "eval_batch_size": 64}
# and approval, skipped: require_approval is off
TASKS = ("validate", "prepare_data", "tokenize", "provision", "train", "evaluate", "release",
         "export", "gate_eval", "gate", "log_to_mlflow", "promote")

RUN_DAGS = """
import json, sys
from bertflow_airflow.demo import run_dag
for name, conf in json.loads(sys.argv[1]).items():
    print("BERTFLOW_SCENARIO " + name, flush=True)
    dag_run = run_dag(conf)
    print("BERTFLOW_RUN " + json.dumps({"run_id": dag_run.run_id,
                                        "run_type": getattr(dag_run.run_type, "value", "")}),
          flush=True)
"""


def run_dags(confs: dict[str, dict], timeout: float = 1800, env: dict | None = None
             ) -> tuple[str, dict[str, str]]:
    """Each named conf's DAG run, in order, in one child process: its whole output (stdout
    and stderr) and, by name, the part each run printed."""
    done = subprocess.run([sys.executable, "-c", RUN_DAGS, json.dumps(confs)],
                          cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, encoding="utf-8", errors="replace",
                          timeout=timeout)
    output = done.stdout
    parts = dict(part.split("\n", 1) for part in output.split("BERTFLOW_SCENARIO ")[1:])
    return output, {name: parts.get(name, "") for name in confs}


def finished_run(name: str, part: str, output: str) -> SimpleNamespace:
    """The DagRun (run_id, run_type) that run `name` printed when dag.test returned."""
    marker = [ln for ln in part.splitlines() if ln.startswith("BERTFLOW_RUN ")]
    assert marker, f"dag.test of {name} did not finish:\n{output[-5000:]}"
    return SimpleNamespace(**json.loads(marker[-1].split(" ", 1)[1]))
