"""A pruned sweep against the same sweep unpruned (issue 44): the wall time pruning saves, and
the winner's test metric side by side.

    ./.venv/bin/python benchmarks/sweep_pruning.py [--rules none,median] [--trials 5]
        [--epochs 2] [--smoke]

Each arm is the bert_sweep DAG run whole by `dag.test()` (real Airflow: a fresh SQLite
metadata database and a fresh interpreter per arm), one arm after the other in one invocation,
on BANKING77's training file (validation_fraction 0.1, held out by the sweep) with its dev
file as the test rows, MiniLM (the offline default checkpoint), batch 32, max_seq_length 64,
validating every 100 steps. The search space is random, log-uniform learning rates in
[5e-6, 3e-4] with a fixed seed, so both arms run the same trials in the same order;
max_parallel_trials 1, so each trial's peers are the trials before it (pruning reads them as
they are; tasks/runs/pruning.py). The rules need two peers: the first two trials always run
whole.

Measured per arm: the dag.test wall time (data, tokenize, every trial, pick_best, the winner's
test evaluation and export), each trial's train task seconds (Airflow's task instance
duration), steps and state (pruned or not, and where), the winner, its validation value and
its test accuracy. Computed: `computed_wall_ratio` = pruned arm / the `none` arm, and
`computed_test_delta` = the pruned arm's winner's test accuracy minus the `none` arm's.

`--smoke`: a tiny random BERT on synthetic rows, 3 trials of a few steps, results in a
temporary folder.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lib import common

TRAIN, TEST = "banking77/train.tsv", "banking77/dev.tsv"
RECIPE = {"per_replica_batch_size": 32, "max_seq_length": 64, "warmup_ratio": 0.1,
          "weight_decay": 0.01, "validation_fraction": 0.1, "eval_every_steps": 100,
          "checkpoint_every_steps": 100_000, "max_parallel_trials": 1, "seed": 0}
SPACE_SEED = 0


def one_arm(conf_file: Path, out: Path) -> None:
    """In a fresh interpreter whose AIRFLOW_HOME is migrated: dag.test the sweep, write the
    figures to `out`."""
    from airflow.dag_processing.dagbag import DagBag

    from tasks.io import storage
    from tasks.io.uris import join_uri

    conf = json.loads(conf_file.read_text())
    dag = DagBag(dag_folder=str(common.PROJECT_ROOT / "dags")).dags["bert_sweep"]
    started = time.perf_counter()
    run = dag.test(run_conf=conf)
    wall = time.perf_counter() - started
    if run.state != "success":
        failed = sorted(f"{ti.task_id}[{ti.map_index}]" for ti in run.get_task_instances()
                        if ti.state != "success")
        raise SystemExit(f"the sweep ended {run.state}; not successful: {failed}")
    seconds = {ti.map_index: ti.duration for ti in run.get_task_instances()
               if ti.task_id == "trial.train"}
    runs = Path(conf["artifact_root"]) / "runs" / "bert_sweep"
    sweep = next(p for p in runs.iterdir() if "__trial-" not in p.name)
    best = storage.read_json(join_uri(str(sweep), "best", "manifest.json"))
    trials = []
    for row in best["trials"]:
        trained = storage.read_json(join_uri(row["run_uri"], "train", "manifest.json"))
        trials.append({"learning_rate": trained["base_learning_rate"],
                       "train_task_s": seconds[row["index"] - 1], "steps": trained["steps"],
                       "total_steps": trained["total_steps"], "pruned": row["pruned"],
                       "validation_value": row["validation"]})
    winner = best["best"]
    tested = storage.read_json(join_uri(winner["run_uri"], "evaluate", "manifest.json"))
    out.write_text(json.dumps({
        "dag_test_wall_s": wall, "trials": trials, "winner_index": winner["index"],
        "winner_learning_rate": trials[winner["index"] - 1]["learning_rate"],
        "winner_validation_value": trials[winner["index"] - 1]["validation_value"],
        "winner_test_accuracy": tested["metrics"]["accuracy"],
        "pruned_trials": sum(1 for t in trials if t["pruned"])}))


def run_arm(work: Path, rule: str, conf: dict) -> dict:
    home = work / f"airflow-{rule}"
    home.mkdir()
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__CORE__DAGS_FOLDER": str(common.PROJECT_ROOT / "dags"),
           "AIRFLOW__CORE__PLUGINS_FOLDER": str(common.PROJECT_ROOT / "plugins"),
           "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    bin_dir = Path(common.PRODUCT_PYTHON).parent
    subprocess.run([str(bin_dir / "airflow"), "db", "migrate"], env=env, check=True,
                   capture_output=True)
    conf_file, out = work / f"{rule}.json", work / f"{rule}.out.json"
    conf_file.write_text(json.dumps({**conf, "artifact_root": str(work / f"art-{rule}"),
                                     "model_name": f"sweep-{rule}", "sweep_pruning": rule}))
    proc = subprocess.run([common.PRODUCT_PYTHON, __file__, "--one-arm", str(conf_file),
                           str(out)], env=env, cwd=common.BENCH_DIR, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the {rule} arm failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


def main() -> None:
    if sys.argv[1:2] == ["--one-arm"]:
        one_arm(Path(sys.argv[2]), Path(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rules", default="none,median",
                    help="the first is the baseline the others are compared with")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    rules = args.rules.split(",")
    space = {"random": {"learning_rate": {"low": 5e-6, "high": 3e-4, "log": True}},
             "trials": args.trials, "seed": SPACE_SEED}
    recipe = dict(RECIPE)
    with tempfile.TemporaryDirectory(prefix="sweep-pruning-") as tmp:
        work = Path(tmp)
        model_dir = ""
        if args.smoke:
            common.smoke_results_dir()
            common.DATA_ROOT = common.smoke_data_root(work / "data", rows=240)
            (work / "data" / "banking77").mkdir()
            for split in ("train", "dev"):
                (work / "data" / "banking77" / f"{split}.tsv").write_bytes(
                    (work / "data" / "snips" / "train.tsv").read_bytes())
            model_dir = str(common.smoke_model_dir(work / "tiny-random-bert"))
            args.trials, args.epochs = 3, 1
            space["trials"] = 3
            recipe.update(per_replica_batch_size=16, max_seq_length=16, eval_every_steps=4,
                          num_shards=1, mixed_precision="none")
        common.require_data(TRAIN, TEST)
        conf = {"train_uri": str(common.DATA_ROOT / TRAIN),
                "test_uri": str(common.DATA_ROOT / TEST), "base_model": model_dir,
                "epochs": args.epochs, **recipe, "search_space": space}
        arms = {}
        for rule in rules:
            arms[rule] = run_arm(work, rule, conf)
            a = arms[rule]
            print(f"{rule}: {a['dag_test_wall_s']:.0f} s, {a['pruned_trials']} of "
                  f"{len(a['trials'])} trials pruned, winner lr "
                  f"{a['winner_learning_rate']:.2e}, test accuracy "
                  f"{a['winner_test_accuracy']:.4f}", flush=True)
    base = arms[rules[0]]
    computed = {rule: {"computed_wall_ratio": a["dag_test_wall_s"] / base["dag_test_wall_s"],
                       "computed_test_delta": (a["winner_test_accuracy"]
                                               - base["winner_test_accuracy"])}
                for rule, a in arms.items() if rule != rules[0]}
    for rule, c in computed.items():
        print(f"{rule} vs {rules[0]}: wall {c['computed_wall_ratio']:.2f}x, winner's test "
              f"accuracy {c['computed_test_delta']:+.4f}", flush=True)
    common.write_results("sweep_pruning", {
        "smoke": args.smoke, "epochs": args.epochs, "recipe": recipe, "search_space": space,
        "baseline": rules[0], "arms": arms, "computed": computed})


if __name__ == "__main__":
    main()
