"""Batch scoring at scale (issue 46, "Scale"): bert_batch_score over 1M rows with flat memory,
in the workers and in the Airflow task processes.

    ./.venv/bin/python benchmarks/score_scale.py [--sizes 100000,1000000]
        [--formats jsonl,parquet] [--workers 2] [--batch-size 64] [--shard-rows 10000]
        [--model minilm|tiny] [--work /tmp/bertflow-score-scale] [--smoke]

Rows are generated as benchmarks/scale.py generates them (SST-2 and SNIPS rows with a prefix
and suffix drawn per row, a TSV on local disk under `--work`, outside the repository). One
model version is made first, untimed (benchmarks/batch_score_throughput.py's make_version: a
few training steps from the offline MiniLM checkpoint, exported). Then for each size and
output format, the DAG's three tasks run as Airflow runs them, each in a fresh process that
imports the DAG file (Airflow included):
- validate: the @task's own function (Params, column check, model version, and the plan:
  the whole input streamed once to count and hash it);
- score: ScoreWorkersOperator.execute, which starts `--workers` local `python -m tasks
  score` worker processes (cold: no warm-start server) and waits for every shard;
- publish: tasks.scoring.publish (the @task's work without its asset event).
Recorded per task: the process's peak RSS (VmHWM, as scale.py records its controller) and
seconds; for score also the workers' peak RSS (`getrusage` maximum over the waited-for
children, as scale.py: an upper bound) and rows per second.

Targets: the workers' and each task process's peak RSS at the largest size within 10% of
the smallest's (flat: nothing grows with the rows); every Airflow task process < 300 MB.
Expect the run to take about (sum of sizes x formats) / (batch_score_throughput.py's rows
per second at `--workers`).

`--model tiny` scores with the smoke's tiny random BERT (2 layers, hidden 32) instead of
MiniLM: what grows with the rows (reading, planning, writing, publishing) is the same, and
1M rows take minutes instead of about 2 hours per format at MiniLM's ~150 rows/s on 2 cores
(computed from results/batch_score_throughput.json); its rows per second mean little.

`--version URI` scores with a model version published elsewhere (no training run here).

`--smoke`: a tiny random BERT, 120 and 240 synthetic rows, Parquet only, 1 worker, work
files and results in temporary folders; the model version's steps fork from a warm-start
server (common.smoke_warm_server), the tasks and scoring workers still start cold (only the
harness is checked; its figures mean nothing). The tests pass `--version` (one tiny version
made once for the scoring smokes: making one was ~40 s of each smoke).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lib import common
from batch_score_throughput import make_version
from scale import base_rows, generate

TARGETS = {"rss_growth_ratio": 1.1, "airflow_task_rss_bytes": 300 << 20}

# One DAG task in its own process, as Airflow's task runner runs it: the DAG file imported,
# then the task's work; its peak RSS and seconds on the last line.
TASK = r"""
import json, os, resource, sys, time
from types import SimpleNamespace
t0 = time.perf_counter()
import importlib.util
spec = importlib.util.spec_from_file_location("bert_batch_score_dag",
                                              sys.argv[2] + "/dags/bert_batch_score.py")
module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
from bertflow_airflow import scoring
task, arg = sys.argv[1], sys.argv[3]
t1 = time.perf_counter()
if task == "validate":  # arg: the Params as JSON; prints the run folder's URI
    run = SimpleNamespace(dag_id=scoring.DAG_ID, run_id=os.environ["SCALE_RUN_ID"],
                          run_type="manual", logical_date=None, data_interval_start=None,
                          data_interval_end=None)
    out = scoring.validate.function(params=json.loads(arg), dag_run=run)
elif task == "score":  # arg: the run folder
    out = scoring.ScoreWorkersOperator(task_id="score", step="score", run_uri=arg).execute({})
else:
    from bertflow_airflow.worker_operator import load_run
    from tasks.scoring.publish import publish
    out = publish(load_run(arg)[1])
t2 = time.perf_counter()
hwm = [int(ln.split()[1]) * 1024 for ln in open("/proc/self/status")
       if ln.startswith("VmHWM:")][0]
print("SCALE " + json.dumps({
    "out": out, "rss_bytes": hwm,
    "worker_rss_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
    "import_seconds": t1 - t0, "seconds": t2 - t1}))
"""


def run_task(task: str, arg: str, env: dict) -> dict:
    proc = subprocess.run([sys.executable, "-c", TASK, task, str(common.PROJECT_ROOT), arg],
                          cwd=common.PROJECT_ROOT, env=env, capture_output=True, text=True)
    marker = [ln for ln in proc.stdout.splitlines() if ln.startswith("SCALE ")]
    if proc.returncode or not marker:
        raise SystemExit(f"{task} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(marker[-1][len("SCALE "):])


def score_run(work: Path, path: Path, rows: int, fmt: str, version: str, args,
              env: dict) -> dict:
    """validate, score and publish of one input in one output format."""
    from tasks.provision.local.cluster import local_tmp_root

    params = {"input_uri": str(path), "model": version, "output_format": fmt,
              "output_uri": str(work / "scores"), "artifact_root": str(work / "artifacts"),
              "num_workers": args.workers, "batch_size": args.batch_size,
              "shard_rows": args.shard_rows}
    env = {**env, "SCALE_RUN_ID": f"scale-{rows}-{fmt}"}
    validate = run_task("validate", json.dumps(params), env)
    run_uri = validate.pop("out")
    score = run_task("score", run_uri, env)
    score.pop("out")
    publish = run_task("publish", run_uri, env)
    summary = publish.pop("out")
    for step in (validate, publish):
        step.pop("worker_rss_bytes")  # starts no process
    score["rows_per_second"] = summary["rows"] / score["seconds"]
    output = Path(summary["output_uri"])
    out = {"rows": rows, "format": fmt, "file_bytes": path.stat().st_size,
           "scored_rows": summary["rows"], "error_rows": summary["error_rows"],
           "shards": summary["shards"],
           "output_bytes": sum(p.stat().st_size for p in output.glob("part-*")),
           "validate": validate, "score": score, "publish": publish}
    mb = {name: step["rss_bytes"] / 2**20 for name, step in (
        ("validate", validate), ("score", score), ("publish", publish))}
    print(f"  {rows:>11,} rows {fmt:<8} validate {validate['seconds']:7.1f} s "
          f"{mb['validate']:5.0f} MB | score {score['seconds']:7.1f} s "
          f"{score['rows_per_second']:8,.0f} rows/s, workers "
          f"{score['worker_rss_bytes'] / 2**20:5.0f} MB, task {mb['score']:5.0f} MB | "
          f"publish {mb['publish']:5.0f} MB", flush=True)
    shutil.rmtree(output, ignore_errors=True)  # 1M rows of scores: not kept
    # The workers' scratch folders: the DAG's release teardown removes them; not run here.
    tmp_root = local_tmp_root(run_uri)
    shutil.rmtree(tmp_root, ignore_errors=True)
    with contextlib.suppress(OSError):
        tmp_root.parent.rmdir()
    return out


def verdict(runs: list[dict]) -> dict:
    """Per format: peak RSS at the largest size over the smallest's, per process kind."""
    growth = {}
    for fmt in dict.fromkeys(r["format"] for r in runs):
        mine = sorted((r for r in runs if r["format"] == fmt), key=lambda r: r["rows"])
        small, large = mine[0], mine[-1]
        growth[fmt] = {
            "workers": large["score"]["worker_rss_bytes"] / small["score"]["worker_rss_bytes"],
            **{task: large[task]["rss_bytes"] / small[task]["rss_bytes"]
               for task in ("validate", "score", "publish")}}
    airflow = max(r[t]["rss_bytes"] for r in runs for t in ("validate", "score", "publish"))
    worst = max(v for g in growth.values() for v in g.values())
    return {"rss_growth_largest_over_smallest": growth, "max_rss_growth": worst,
            "flat_ok": worst <= TARGETS["rss_growth_ratio"],
            "airflow_task_rss_bytes": airflow,
            "airflow_task_ok": airflow < TARGETS["airflow_task_rss_bytes"],
            "max_worker_rss_bytes": max(r["score"]["worker_rss_bytes"] for r in runs)}


def made_version(work: Path, args, base: list, model_dir: str) -> str:
    """A version trained a few steps on `--train-rows` generated rows (untimed); its URI."""
    train = work / "train.tsv"
    generate(train, args.train_rows, base)
    t0 = time.perf_counter()
    with common.smoke_warm_server(args.smoke, work / "warm_start.log") as socket:
        version = make_version(work, "scale", train, model_dir, args.smoke, socket)
    print(f"model version made in {time.perf_counter() - t0:.0f} s (untimed)", flush=True)
    return version


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--formats", default="jsonl,parquet")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--shard-rows", type=int, default=10_000)
    ap.add_argument("--train-rows", type=int, default=2000,
                    help="rows of the few-step training run that makes the model version")
    ap.add_argument("--model", choices=("minilm", "tiny"), default="minilm",
                    help="tiny: a 2-layer random BERT; memory, not speed, is measured")
    ap.add_argument("--work", default="/tmp/bertflow-score-scale")
    ap.add_argument("--version", default="",
                    help="a published model version's URI to score with (none is made)")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    model_dir = ""  # the offline MiniLM checkpoint
    if args.smoke:
        common.smoke_results_dir()
        args.work = tempfile.mkdtemp(prefix="bench-score-scale-smoke-")
        common.DATA_ROOT = common.smoke_data_root(Path(args.work) / "data")
        args.sizes, args.formats, args.workers, args.train_rows = "120,240", "parquet", 1, 48
        args.shard_rows = 50
    work = Path(args.work)
    if str(work.resolve()).startswith(str(common.PROJECT_ROOT)):
        raise SystemExit("--work must be outside the repository")
    base = base_rows()  # before any work: a missing data set fails first
    work.mkdir(parents=True, exist_ok=True)
    if (args.smoke or args.model == "tiny") and not args.version:
        model_dir = str(common.smoke_model_dir(work / "tiny-random-bert"))
    sizes = [int(s) for s in args.sizes.split(",") if s]
    formats = args.formats.split(",")
    # Cold workers, as on a scheduler without the warm-start server.
    env = {k: v for k, v in os.environ.items() if k != "BERTFLOW_WARM_SOCKET"}
    env.update(TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    try:
        version = args.version or made_version(work, args, base, model_dir)
        runs = []
        for n in sizes:
            path = work / f"score-{n}.tsv"
            generate(path, n, base)
            for fmt in formats:
                shutil.rmtree(work / "artifacts" / "runs" / "bert_batch_score",
                              ignore_errors=True)
                runs.append(score_run(work, path, n, fmt, version, args, env))
    finally:  # the generated inputs are kept for a re-run (not a smoke's)
        for name in ("artifacts", "scores"):
            shutil.rmtree(work / name, ignore_errors=True)
        if args.smoke:
            shutil.rmtree(work, ignore_errors=True)
    result = verdict(runs)
    print(json.dumps(result, indent=2))
    common.write_results("score_scale", {
        "smoke": args.smoke, "load_average": list(os.getloadavg()), "targets": TARGETS,
        "model": ("the version given by --version" if args.version
                  else ("tiny random BERT (2 layers, hidden 32)" if model_dir
                        else "MiniLM-L6 (offline checkpoint)") + ", a few training steps"),
        "workers": args.workers, "batch_size": args.batch_size,
        "shard_rows": args.shard_rows, "formats": formats, "runs": runs, "verdict": result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
