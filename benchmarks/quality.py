"""Benchmark 4: quality after fine-tuning the default checkpoint with bertflow's own pipeline.

    ./.venv/bin/python benchmarks/quality.py [--datasets sst2,snips,banking77]
        [--epochs 1] [--limit N] [--max-steps N] [--set field=value ...]

Per dataset it creates a run folder and runs the real steps as the workers do:
`python -m tasks init-run`, then `python -m tasks {data,tokenize,train,evaluate} --run-dir RUN`.
SST-2: train.tsv only, held-out = the seeded (seed 42) stratified 10% split of the data step.
SNIPS, BANKING77: train.tsv for training, dev.tsv for evaluation. Reports accuracy and macro-F1
from evaluate/metrics.json plus each step's wall time. Target: SST-2 held-out accuracy >= 90%
after 1 epoch. --limit (rows of each train file) and --max-steps make a quick run.
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

import common

PY = str(common.PROJECT_ROOT / ".venv" / "bin" / "python")
DATASETS = {"sst2": ("sst2/train.tsv", None), "snips": ("snips/train.tsv", "snips/dev.tsv"),
            "banking77": ("banking77/train.tsv", "banking77/dev.tsv")}
STEPS = ("data", "tokenize", "train", "evaluate")
TARGET_SST2 = 0.90


def head(src: Path, dst: Path, rows: int) -> Path:
    # newline="": texts may hold a stray \r, which universal newlines would split.
    with open(src, encoding="utf-8", newline="") as f, \
            open(dst, "w", encoding="utf-8", newline="") as g:
        for i, line in enumerate(f):
            if i > rows:
                break
            g.write(line)
    return dst


def tasks_cli(*argv: str) -> str:
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([PY, "-m", "tasks", *argv], cwd=common.PROJECT_ROOT, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"python -m tasks {' '.join(argv)} failed:\n{proc.stderr[-4000:]}")
    return proc.stdout.strip().splitlines()[-1]


def run_dataset(name: str, work: Path, args) -> dict:
    train_rel, eval_rel = DATASETS[name]
    train, = common.require_data(train_rel)
    if args.limit:
        train = head(train, work / f"{name}-train.tsv", args.limit)
    run_dir = work / "art" / "runs" / "quality" / name
    cfg = {"train_uri": str(train), "epochs": args.epochs, "max_steps": args.max_steps,
           "per_replica_batch_size": 32, "seed": 42, "artifact_root": str(work / "art")}
    if eval_rel:
        cfg["eval_uri"] = str(common.require_data(eval_rel)[0])
    else:
        cfg["eval_uri"] = None
        cfg["eval_fraction"] = 0.1
    for kv in args.set:
        k, v = kv.split("=", 1)
        try:
            cfg[k] = json.loads(v)
        except json.JSONDecodeError:
            cfg[k] = v
    cfg_file = work / f"{name}-config.json"
    cfg_file.write_text(json.dumps(cfg))
    tasks_cli("init-run", "--run-dir", str(run_dir), "--config", str(cfg_file))
    times = {}
    for step in STEPS:
        t0 = time.perf_counter()
        tasks_cli(step, "--run-dir", str(run_dir))
        times[step] = time.perf_counter() - t0
        print(f"  {name}: {step} {times[step]:.1f}s", flush=True)
    metrics = json.loads((run_dir / "evaluate" / "metrics.json").read_text())
    train_m = json.loads((run_dir / "train" / "manifest.json").read_text())
    data_m = json.loads((run_dir / "data" / "manifest.json").read_text())
    return {"accuracy": metrics["accuracy"], "macro_f1": metrics["macro_f1"],
            "num_eval_examples": metrics["num_examples"],
            "num_train_examples": data_m["splits"]["train"]["num_examples"],
            "train_steps": train_m.get("steps"),
            "train_examples_per_second": train_m.get("examples_per_second"),
            "step_seconds": times, "wall_seconds": sum(times.values()), "config": cfg}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="sst2,snips,banking77")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--limit", type=int, default=0, help="rows of each train file (0 = all)")
    ap.add_argument("--max-steps", type=int, default=0, help="0 = full epochs")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="extra RunConfig field (JSON value), e.g. mixed_precision=\"none\"")
    ap.add_argument("--keep", action="store_true", help="keep the run folders")
    args = ap.parse_args()
    common.require_data(*[DATASETS[d][0] for d in args.datasets.split(",")])
    work = Path(tempfile.mkdtemp(prefix="bench-quality-"))
    results = {}
    for name in args.datasets.split(","):
        try:
            results[name] = run_dataset(name, work, args)
        except RuntimeError as err:  # keep the other data sets' figures
            print(f"{name}: FAILED: {err}", flush=True)
            results[name] = {"error": str(err)[-2000:]}
            continue
        r = results[name]
        print(f"{name}: accuracy {r['accuracy']:.4f}  macro-F1 {r['macro_f1']:.4f}  "
              f"({r['num_train_examples']} train / {r['num_eval_examples']} eval, "
              f"{r['train_steps']} steps, wall {r['wall_seconds']:.0f}s)", flush=True)
    quick = bool(args.limit or args.max_steps)
    target = None
    if "accuracy" in results.get("sst2", {}):
        target = common.verdict(100 * results["sst2"]["accuracy"], 100 * TARGET_SST2, "%")
        if quick or args.epochs != 1:
            target += " (not a full 1-epoch run: not comparable with the target)"
        print(f"target SST-2 held-out accuracy >= 90% after 1 epoch: {target}")
    if not args.keep:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"run folders kept under {work}")
    common.write_results("quality", {"quick_run": quick, "epochs": args.epochs,
                                     "limit": args.limit, "max_steps": args.max_steps,
                                     "target_sst2": target, "results": results})


if __name__ == "__main__":
    sys.exit(main())
