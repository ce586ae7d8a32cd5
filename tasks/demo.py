"""`make demo`: run the bert_finetune DAG end to end on the demo data set, then load the
exported model in a fresh process (TensorFlow + tensorflow-text only, not this project) and
print two of its predictions.

Airflow runs from the project's .airflow/ folder (SQLite metadata DB, created on first use)
with dags/ and plugins/ from this checkout. A demo-sized config (short sequences, 2 epochs on
~300 rows) finishes in a few minutes on 2 CPUs.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from tasks.config import PROJECT_ROOT, join_uri

DAG_ID = "bert_finetune"
DEMO_CONF = {"max_seq_length": 64, "epochs": 2, "per_replica_batch_size": 16,
             "learning_rate": 1e-4, "checkpoint_every_steps": 20}

# Runs in a fresh interpreter: proves the SavedModel serves raw strings with nothing but
# TensorFlow and tensorflow-text (for the tokenizer's custom ops) installed.
PREDICT = """
import json, sys
import tensorflow as tf, tensorflow_text  # noqa: F401  (registers the tokenizer ops)
path, rows = sys.argv[1], json.loads(sys.argv[2])
serve = tf.saved_model.load(path).signatures["serving_default"]
inputs = {k: tf.constant([r[k] for r in rows]) for k in rows[0]}
out = serve(**inputs)
print(json.dumps([{"label": l.decode(), "probabilities": [round(float(x), 4) for x in p]}
                  for l, p in zip(out["label"].numpy(), out["probabilities"].numpy())]))
"""


def airflow_env(airflow_home: Path) -> dict[str, str]:
    return {
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }


def predict_in_fresh_process(saved_model_dir: str, rows: list[dict]) -> list[dict]:
    """rows: [{"text": ...} or {"text": ..., "text_pair": ...}] -> [{"label", "probabilities"}]"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    done = subprocess.run([sys.executable, "-c", PREDICT, saved_model_dir, json.dumps(rows)],
                          capture_output=True, text=True, cwd="/", env=env)
    if done.returncode != 0:
        raise RuntimeError(f"loading the exported model failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_dag(conf: dict):
    """Run the DAG once through dag.test(); returns the DagRun."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(PROJECT_ROOT / "dags"))
    if bag.import_errors:
        raise RuntimeError(f"DAG import errors: {bag.import_errors}")
    return bag.dags[DAG_ID].test(run_conf=conf)


def run_folder(dag_run, artifact_root: str) -> str:
    from tasks.runlayout import RunContext, run_key_for

    run_type = getattr(dag_run.run_type, "value", dag_run.run_type)
    return RunContext(artifact_root, DAG_ID, run_key_for(run_type, None, dag_run.run_id)).run_uri


def sample_rows(run_uri: str, count: int = 2) -> list[dict]:
    """The first rows of the run's evaluation split, as serving inputs."""
    from tasks import storage

    manifest = storage.read_json(join_uri(run_uri, "data", "manifest.json"))
    lines = storage.read_text(manifest["splits"]["eval"]["uri"]).splitlines()[:count]
    rows = [json.loads(line) for line in lines]
    return [{"text": r["text"], **({"text_pair": r["text_pair"]} if r.get("text_pair") else {})}
            for r in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.demo", description=__doc__)
    parser.add_argument("--num-workers", type=int, default=1,
                        help="worker processes; 2 trains with MultiWorkerMirroredStrategy")
    args = parser.parse_args(argv)

    airflow_home = PROJECT_ROOT / ".airflow"
    os.environ.update(airflow_env(airflow_home))  # before Airflow is first imported
    if not (airflow_home / "airflow.db").exists():
        print(f"Creating the Airflow metadata DB in {airflow_home} ...", flush=True)
        subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"],
                       check=True, stdout=subprocess.DEVNULL)

    from tasks import storage
    from tasks.config import parse_config

    conf = {**DEMO_CONF, "num_workers": args.num_workers}
    cfg = parse_config(conf)
    dag_run = run_dag(conf)
    run_uri = run_folder(dag_run, cfg.artifact_root)
    print(f"\nDAG run {dag_run.run_id}: {dag_run.state}; run folder {run_uri}")
    if dag_run.state != "success":
        print("The run failed; see the task logs above.", file=sys.stderr)
        return 1

    exported = storage.read_json(join_uri(run_uri, "export", "manifest.json"))
    metrics = storage.read_json(join_uri(run_uri, "evaluate", "manifest.json"))["metrics"]
    promoted = storage.read_json(join_uri(run_uri, "promote", "manifest.json"))
    tokenized = storage.read_json(join_uri(run_uri, "tokenize", "manifest.json"))
    print(f"Tokenized data: {tokenized['cache_uri']} "
          f"({'reused from an earlier run' if tokenized['reused'] else 'new'})")
    print(f"Exported model: {exported['version_uri']}")
    print(f"Eval metrics:   {json.dumps(metrics)}")
    print(f"Promoted:       {promoted['promoted']}")
    rows = sample_rows(run_uri)
    with storage.staged_local_dir(join_uri(exported["version_uri"], "saved_model")) as path:
        predictions = predict_in_fresh_process(str(path), rows)
    for row, pred in zip(rows, predictions):
        print(f"  {row} -> {pred['label']} {pred['probabilities']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
