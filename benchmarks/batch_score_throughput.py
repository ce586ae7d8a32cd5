"""Batch scoring throughput (issue 46): bert_batch_score's workers scoring with the exported
SavedModel against transformers' `pipeline` (PyTorch, batch size set, truncation on) on the
same model and the same rows, both sides in one invocation.

    ./.venv/bin/python benchmarks/batch_score_throughput.py [--datasets sst2,banking77]
        [--rows 4000] [--workers 1,2] [--batch-size 64] [--sides bertflow,peer] [--smoke]

Per data set, one model version is made once, untimed: init-run, data, tokenize, train (a few
steps from the offline MiniLM checkpoint: throughput does not depend on the weights' values),
evaluate and export, as the DAG runs them. Its version folder is the SavedModel bertflow
scores with and a Hugging Face checkpoint, which the peer's pipeline loads. The first
`--rows` texts of the data set's train.tsv are scored by:
- bertflow, for each `--workers` count: `python -m tasks init-score` (checks and plan, timed
  as `plan_s`), then the score step's workers through LocalCluster in fresh interpreters (the
  local backend without the warm-start server: each worker pays its TensorFlow import),
  `wall_s` from their start to the last shard; `startup_s` to the first shard's start (import
  and model load), so `plan_s + startup_s` is the fixed cost to the first row scored;
  `rows_per_s` = rows / (last shard's end - first shard's start), the scoring rate as the
  peer's is counted; `wall_rows_per_s` = rows / wall_s, start-up included;
- the peer (benchmarks/peers/_peer_score_worker.py in .venv-peer): the pipeline's load and its
  scoring of the same texts in batches of `--batch-size`; `rows_per_s` = rows / score_s
  (its load not counted: in its favour).
`computed_speedup` = bertflow's rows_per_s at each worker count / the peer's.

`--smoke`: a tiny random BERT on synthetic rows, one data set, 1 worker, results in a
temporary folder; the model version's steps fork from a warm-start server (common.
smoke_warm_server), the scoring worker still starts cold. Only the harness is checked by it;
its figures mean nothing. `--version URI` (one data set): score with a model version
published elsewhere, none is made; the tests pass the one tiny version they make once for
the scoring smokes (making one was ~40 s of each smoke).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lib import common

DATASETS = {"sst2": "sst2/train.tsv", "banking77": "banking77/train.tsv"}
PEER_PY = common.PROJECT_ROOT / ".venv-peer" / "bin" / "python"
W_PEER = str(Path(__file__).resolve().parent / "peers" / "_peer_score_worker.py")
RECIPE = {"max_seq_length": 128, "max_steps": 2, "per_replica_batch_size": 16,
          "num_shards": 1, "checkpoint_every_steps": 100_000}


def make_version(work: Path, name: str, train: Path, model_dir: str, smoke: bool,
                 warm_socket: Path | None = None) -> str:
    """A published version trained a few steps on `train`; its URI. With `warm_socket` (a
    smoke's) the steps after init-run fork from that warm-start server, else each is a fresh
    interpreter."""
    run_dir = work / "artifacts" / "runs" / "manual" / f"train-{name}"
    config = {**RECIPE, "train_uri": str(train), "artifact_root": str(work / "artifacts"),
              "model_name": f"bench-{name}", "base_model": model_dir}
    if smoke:
        config.update(max_seq_length=16, max_steps=1)
    common.prepared_run(run_dir, config, work / f"train-{name}.json", warm_socket)
    for step in ("train", "evaluate", "export"):
        common.run_step(step, run_dir, warm_socket)
    return json.loads((run_dir / "export" / "manifest.json").read_text())["version_uri"]


def score_texts(work: Path, name: str, source: Path, rows: int) -> tuple[Path, Path]:
    """The first `rows` texts of `source`: a TSV for bertflow, JSON lines for the peer."""
    with open(source, encoding="utf-8", newline="") as f:
        texts = [row["text"] for _, row in zip(range(rows), csv.DictReader(f, delimiter="\t"))]
    tsv, lines = work / f"score-{name}.tsv", work / f"score-{name}.jsonl"
    with open(tsv, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t")
        writer.writerow(["text"])
        writer.writerows([t] for t in texts)
    lines.write_text("".join(json.dumps(t) + "\n" for t in texts), encoding="utf-8")
    return tsv, lines


def bertflow_side(work: Path, name: str, tsv: Path, version: str, workers: int,
                  batch: int, rows: int) -> dict:
    from tasks.provision.local.cluster import LocalCluster
    from tasks.provision.spec import scoring_spec
    from tasks.runs.runlayout import load_run
    from tasks.scoring import shards
    from tasks.scoring.plan import read_plan

    run_dir = work / "artifacts" / "runs" / "manual" / f"score-{name}-{workers}"
    t0 = time.perf_counter()
    common.tasks_cli("init-score", "--run-dir", str(run_dir), "--input-uri", str(tsv),
                     "--model", version, "--output-uri", str(work / "scores"),
                     "--artifact-root", str(work / "artifacts"), "--num-workers", str(workers),
                     "--batch-size", str(batch),
                     "--shard-rows", str(max(1, math.ceil(rows / (4 * workers)))))
    plan_s = time.perf_counter() - t0
    os.environ.pop("BERTFLOW_WARM_SOCKET", None)  # fresh interpreters, as a cold worker
    lines: list[str] = []
    started = time.time()
    t1 = time.perf_counter()
    LocalCluster(scoring_spec(str(run_dir), workers, accelerated=False),
                 log=lines.append).run()
    wall = time.perf_counter() - t1
    _, ctx = load_run(str(run_dir))
    records = shards.published(read_plan(ctx)["output_uri"])
    scored = sum(r["rows"] for r in records.values())
    first = min(r["started"] for r in records.values())
    last = max(r["ended"] for r in records.values())
    return {"workers": workers, "rows": scored, "plan_s": plan_s, "wall_s": wall,
            "startup_s": first - started, "rows_per_s": scored / (last - first),
            "wall_rows_per_s": scored / wall}


def peer_side(lines: Path, version: str, batch: int, max_length: int) -> dict:
    if not PEER_PY.exists():
        raise SystemExit(f"error: {PEER_PY} is missing. Create the peer venv: python3 -m venv "
                         ".venv-peer && .venv-peer/bin/pip install -r benchmarks/requirements.txt")
    done = subprocess.run([str(PEER_PY), W_PEER, "--texts", str(lines), "--model-dir", version,
                           "--batch-size", str(batch), "--max-length", str(max_length)],
                          capture_output=True, text=True, cwd=common.PROJECT_ROOT)
    result = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode != 0 or not result:
        raise RuntimeError(f"peer worker failed:\n{done.stderr[-3000:]}")
    return json.loads(result[-1][len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="sst2,banking77")
    ap.add_argument("--rows", type=int, default=4000)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--sides", default="bertflow,peer")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--version", default="",
                    help="a published model version's URI to score with (none is made)")
    args = ap.parse_args()
    names, sides = args.datasets.split(","), args.sides.split(",")
    if args.version and len(names) > 1 and not args.smoke:
        ap.error("--version scores one data set: give one with --datasets")
    workers = [int(w) for w in args.workers.split(",")]
    if not args.smoke:  # before any work or temporary file
        for name in names:
            common.require_data(DATASETS[name])
    with tempfile.TemporaryDirectory(prefix="batch-score-") as tmp:
        work = Path(tmp)
        model_dir = ""  # the offline MiniLM checkpoint
        max_length = RECIPE["max_seq_length"]
        if args.smoke:
            common.smoke_results_dir()
            common.DATA_ROOT = common.smoke_data_root(work / "data", rows=48)
            model_dir = str(common.smoke_model_dir(work / "tiny-random-bert"))
            names, workers, args.rows, max_length = names[:1], workers[:1], 48, 16
        results: dict[str, dict] = {}
        for name in names:
            source = common.DATA_ROOT / DATASETS[name]
            version = args.version
            if not version:
                with common.smoke_warm_server(args.smoke, work / "warm_start.log") as socket:
                    version = make_version(work, name, source, model_dir, args.smoke, socket)
            tsv, lines = score_texts(work, name, source, args.rows)
            entry: dict = {"rows": args.rows}
            if "bertflow" in sides:
                entry["bertflow"] = [bertflow_side(work, name, tsv, version, w,
                                                   args.batch_size, args.rows)
                                     for w in workers]
            if "peer" in sides:
                entry["peer"] = peer_side(lines, version, args.batch_size, max_length)
            if "bertflow" in sides and "peer" in sides:
                entry["computed_speedup"] = {
                    str(run["workers"]): run["rows_per_s"] / entry["peer"]["rows_per_s"]
                    for run in entry["bertflow"]}
            for run in entry.get("bertflow", []):
                print(f"{name}: bertflow {run['workers']} worker(s) {run['rows_per_s']:.1f} "
                      f"rows/s, fixed cost {run['plan_s'] + run['startup_s']:.1f} s", flush=True)
            if "peer" in entry:
                print(f"{name}: pipeline {entry['peer']['rows_per_s']:.1f} rows/s", flush=True)
            results[name] = entry
        common.write_results("batch_score_throughput", {
            "smoke": args.smoke, "sides": sides, "batch_size": args.batch_size,
            "max_seq_length": max_length, "workers": workers, "datasets": results})


if __name__ == "__main__":
    sys.exit(main())
