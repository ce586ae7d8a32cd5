"""Benchmark: bert-base and bert-large (RANDOM weights) at max_seq_length 128 and 512 on this CPU:
training throughput side by side with the peer, peak RSS, MFU, and the largest per-replica batch
that fits in 24 GiB (computed).

    ./.venv/bin/python benchmarks/model_sizes.py [--preset full|seq128|seq512|float32|tiny] [--repeats 1] [--steps 3] [--smoke]

`--smoke` is `--preset tiny --steps 1 --warmup 1` writing to a temporary folder
($BERTFLOW_BENCH_RESULTS_DIR, or --results-dir), never benchmarks/results/.

The weights are random: no bert-base or bert-large weights ship in any package reachable
offline. Speed and memory do not depend on the values, only on the shapes (bert-base: 12
layers, hidden 768, 12 heads, intermediate 3072; bert-large: 24, 1024, 16, 4096; uncased vocab
of 30,522, which both sides read from the offline MiniLM checkpoint's vocab.txt). The rows are
synthetic: random whole-word tokens, longer than max_seq_length, so every row is truncated to
exactly max_seq_length tokens and every batch is full (no padding).

Sides alternate in this one invocation (A B at one point, B A at the next; A B B A with
--repeats 2), each a fresh process measured alone:
- bertflow: the real train step, `tasks.steps.train.run`
  (benchmarks/workers/_bertflow_train_worker.py: data, tokenize, then train with the default
  config: fit, mixed_precision auto);
- peer: transformers + torch with the HF Trainer's default recipe: torch's fused AdamW
  (adamw_torch_fused), clipping at 1.0, weight decay 0.0, linear decay, with bf16 autocast
  where the CPU has avx512_bf16 or amx_bf16 (benchmarks/peers/_peer_train_worker.py in
  .venv-peer).
Both sides take the same --warmup untimed steps before the timed ones; each run records its
start-up (process start to the end of the first step, `startup_s`) and its recipe.
Throughput is the median of the timed steps' own times (after warm-up steps), as examples/s and
tokens/s. Peak RSS is the child's VmHWM (/proc/PID/status), sampled while it runs. MFU = training FLOPs per second
(trainbench_data.train_flops with the model's sizes) / the best of the matmul probes
(benchmarks/mfu.py) in the side's precision, run before each side.

Memory: bertflow also runs at 2-3 batch sizes per configuration; each measured peak is set
against `tasks.training.memory.estimate` (its error is recorded). The largest batches in 24 GiB
are COMPUTED, from that estimate and from a line through the measured points: nothing here
tries to fill 24 GiB of a shared machine.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from lib import common
from lib import trainbench_data
from lib.synthetic_inputs import MODELS, vocab_file, write_batches, write_random_checkpoint

from tasks.training import memory

PEER_PY = common.PROJECT_ROOT / ".venv-peer" / "bin" / "python"
TF_PY = common.PROJECT_ROOT / ".venv" / "bin" / "python"
W_BERTFLOW = common.BENCH_DIR / "workers" / "_bertflow_train_worker.py"
W_PEER = common.BENCH_DIR / "peers" / "_peer_train_worker.py"
BUDGET = 24 * memory.GIB
MEASURED_LIMIT = 6 * memory.GIB  # what a process may take on the shared machine

# (model, max_seq_length, batch of the side-by-side runs, more batches bertflow runs for the
# memory fit, RunConfig overrides). bert-large holds about 6 GiB of weights, gradients and
# AdamW slots before any activation: its points are batch 1 and 2 at 128, batch 1 at 512.
PRESETS = {
    "full": [
        ("bert-base", 128, 8, (2, 16), {}),
        ("bert-base", 512, 2, (1,), {}),
        ("bert-large", 128, 2, (1,), {}),
        ("bert-large", 512, 1, (), {}),
    ],
    # float32 (mixed_precision none): the estimate's float32 terms
    "float32": [("bert-base", 128, None, (2, 8), {"mixed_precision": "none"})],
    "seq128": [("bert-base", 128, 8, (2, 16), {}), ("bert-large", 128, 2, (1,), {})],
    "seq512": [("bert-base", 512, 2, (), {}), ("bert-large", 512, 1, (), {})],
    "tiny": [("tiny", 32, 2, (4,), {})],
}


# --- running a side -----------------------------------------------------------------------
def vm_hwm(pid: int) -> int:
    """The process's peak resident set (VmHWM, bytes), 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def run_measured(cmd: list[str], env: dict) -> tuple[dict, int, float]:
    """Run a worker alone; (its RESULT, its peak RSS in bytes, wall seconds).

    The peak is the child's VmHWM, read every 0.1 s while it runs (a high-water mark: the last
    read holds it). Not ru_maxrss: Linux carries a parent's RSS at fork into its child's
    ru_maxrss, and this driver holds TensorFlow for the matmul probe."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env,
                                cwd=common.PROJECT_ROOT)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, vm_hwm(proc.pid))
            time.sleep(0.1)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        lines = [ln for ln in out.read().splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not lines:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                               f"{err.read()[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):]), peak, wall


def side_command(side: str, batches: Path, model_dir: Path, warmup: int, bf16: bool,
                 overrides: dict) -> list[str]:
    if side == "bertflow":
        sets = [arg for k, v in overrides.items() for arg in ("--set", f"{k}={v}")]
        return [str(TF_PY), str(W_BERTFLOW), "--batches", str(batches), "--model-dir",
                str(model_dir), "--warmup", str(warmup), *sets]
    if not PEER_PY.exists():
        raise SystemExit(f"error: {PEER_PY} is missing. Create the peer venv: python3 -m venv "
                         f".venv-peer && .venv-peer/bin/pip install -r benchmarks/requirements.txt")
    return [str(PEER_PY), str(W_PEER), "--batches", str(batches), "--model-dir",
            str(model_dir), "--warmup", str(warmup), *(["--bf16"] if bf16 else [])]


def figures(res: dict, rss: int, batch: int, seq: int, flops_per_example: float,
            peak: float) -> dict:
    if "mean_padded_length" in res and round(res["mean_padded_length"]) != seq:
        raise RuntimeError(f"bertflow trained at length {res['mean_padded_length']}, not {seq}")
    step = common.median(res["step_seconds"])
    per_s = batch / step
    return {"median_step_s": step, "examples_per_s": per_s, "tokens_per_s": per_s * seq,
            "peak_rss_bytes": rss, "peak_rss_gib": round(rss / memory.GIB, 2),
            "train_gflop_per_s": per_s * flops_per_example / 1e9,
            "mfu": per_s * flops_per_example / 1e9 / peak, "steps_timed": len(res["step_seconds"]),
            "load_avg_1min_before": res["load_avg_1min_before"], "result": res}


def line_fit(points: list[tuple[int, int]]) -> tuple[float, float] | None:
    """Least-squares (intercept, slope) of peak RSS over batch; None with fewer than 2."""
    if len({b for b, _ in points}) < 2:
        return None
    n = len(points)
    mb = sum(b for b, _ in points) / n
    mr = sum(r for _, r in points) / n
    slope = (sum((b - mb) * (r - mr) for b, r in points)
             / sum((b - mb) ** 2 for b, _ in points))
    return mr - slope * mb, slope


def score(point: dict, best_peak: dict[str, float]) -> None:
    """The estimate's figures for a point from its measured peaks (tasks.training.memory as it
    is now): estimate vs measured, and the largest batches in 24 GiB (COMPUTED). Also each
    side's MFU against the best matmul probe of the whole invocation (`best_peak`, GFLOP/s by
    precision): on a shared CPU a probe is slowed too, the best is the closest to the peak."""
    for side in point["sides"].values():
        side["mfu_vs_best_probe"] = (common.median([r["train_gflop_per_s"] for r in side["runs"]])
                                     / best_peak[point["precision"]])
    shape = memory.BertShape(**point["shape"])
    kwargs = dict(max_seq_length=point["max_seq_length"], bfloat16=point["precision"] == "bf16")
    measured = [(m["batch"], m["bytes"]) for m in point["measured_peak_rss"]]
    point["estimate_vs_measured"] = [
        {"batch": b, "measured_bytes": rss,
         "estimate_bytes": (e := memory.estimate(shape, per_replica_batch_size=b,
                                                 **kwargs)).total,
         "estimate": e.to_dict(), "error": e.total / rss - 1, "over_6gib": rss > MEASURED_LIMIT}
        for b, rss in measured]
    fit = line_fit(measured)
    point["largest_batch_24gib"] = {
        "computed": True,
        "budget_bytes": BUDGET,
        "no_accumulation": memory.largest_batch(shape, BUDGET, **kwargs),
        # custom loop: its accumulators cost 4 bytes per parameter; the global batch is then
        # this times grad_accum_steps, as large as wanted
        "with_accumulation": memory.largest_batch(shape, BUDGET, training_loop="custom",
                                                  grad_accum_steps=2, **kwargs),
        "from_measured_line": (int((BUDGET - fit[0]) // fit[1]) if fit and fit[1] > 0
                               else None),
        "measured_line": ({"intercept_bytes": fit[0], "bytes_per_example": fit[1]}
                          if fit else None),
    }


def summarize(points: list[dict]) -> dict:
    errors = [e["error"] for p in points for e in p["estimate_vs_measured"]]
    worst = max(errors, key=abs) if errors else None
    print(f"estimate vs measured peak RSS: worst error {worst:+.1%} over {len(errors)} points"
          if errors else "no bertflow memory points")
    return {"worst": worst, "max_abs": abs(worst) if errors else None, "points": len(errors),
            "coefficients": {name: getattr(memory, name) for name in (
                "ACT_HIDDEN_BYTES", "ACT_INTERMEDIATE_BYTES", "ACT_SCORES_BYTES",
                "FIXED_OVERHEAD_BYTES")}}


def rescore(name: str) -> None:
    """Recompute the estimate's figures of a results file from its measurements (no runs):
    how the coefficients of tasks/training/memory.py are checked after fitting them."""
    path = common.RESULTS_DIR / f"{name}.json"
    if not path.is_file():
        raise SystemExit(f"error: {path} is missing: run the benchmark first")
    results = json.loads(path.read_text())
    for point in results["points"]:
        point.setdefault("measured_peak_rss", [  # files written before that field
            {"batch": e["batch"], "bytes": e["measured_bytes"]}
            for e in point["estimate_vs_measured"]])
        score(point, {p: v["best"] for p, v in results["peak_gflop_per_s"].items()})
    results["estimate_error"] = summarize(results["points"])
    results["rescored"] = {"date_utc": common.utc_now(),
                           "command": f"./.venv/bin/python benchmarks/model_sizes.py --rescore "
                                      f"--name {name}"}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=2, default=str) + "\n")
    tmp.replace(path)
    print(f"rescored {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="full")
    ap.add_argument("--repeats", type=int, default=1, help="side-by-side runs per side")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per run")
    ap.add_argument("--sides", default="bertflow,peer")
    ap.add_argument("--name", default="model_sizes", help="results file name")
    ap.add_argument("--results-dir", type=Path, default=None,
                    help="default benchmarks/results/ ($BERTFLOW_BENCH_RESULTS_DIR)")
    ap.add_argument("--smoke", action="store_true",
                    help="--preset tiny --steps 1 --warmup 1, results in a temporary folder")
    ap.add_argument("--rescore", action="store_true",
                    help="only recompute the estimate's figures of the results file from its "
                         "measured points, with tasks/training/memory.py as it is now")
    args = ap.parse_args()
    if args.smoke:
        args.preset, args.steps, args.warmup = "tiny", 1, 1
        if args.results_dir is None:
            common.smoke_results_dir()
    if args.results_dir is not None:
        common.RESULTS_DIR = args.results_dir
    if args.rescore:
        return rescore(args.name)
    if args.warmup > args.steps:
        raise SystemExit("error: --warmup must not exceed --steps (the bertflow side trains "
                         "two epochs over the timed rows)")
    sides = args.sides.split(",")
    vocab = vocab_file()
    flags = set(common.cpu_flags())
    bf16 = not flags.isdisjoint({"avx512_bf16", "amx_bf16"})
    precision = "bf16" if bf16 else "fp32"
    import mfu  # the matmul probe; imports TensorFlow
    t_start = time.perf_counter()
    points, probes = [], {"fp32": [], "bf16": []}
    env = common.worker_env({**os.environ, "PYTHONUNBUFFERED": "1"})
    with tempfile.TemporaryDirectory(prefix="bench-model-sizes-") as tmp:
        tmp = Path(tmp)
        for index, (name, seq, batch, memory_batches, overrides) in enumerate(
                PRESETS[args.preset]):
            shape = MODELS[name]
            model_dir = tmp / name
            if not model_dir.exists():
                write_random_checkpoint(shape, model_dir, vocab)
            point_bf16 = bf16 and overrides.get("mixed_precision", "auto") != "none"
            point_precision = "bf16" if point_bf16 else "fp32"
            flops = trainbench_data.train_flops(seq, 1, seq * seq, layers=shape.layers,
                                                hidden=shape.hidden, ffn=shape.intermediate)
            point = {"model": name, "max_seq_length": seq, "batch": batch,
                     "overrides": overrides, "parameters": shape.num_parameters(),
                     "shape": shape.__dict__, "precision": point_precision,
                     "train_flop_per_example": flops, "sides": {}, "memory_runs": []}
            print(f"{name} seq {seq}: {shape.num_parameters() / 1e6:.1f}M parameters "
                  f"(random weights)", flush=True)

            def run(side: str, b: int) -> dict:
                probes[point_precision].append(mfu.matmul_peak(point_precision, reps=3))
                path = write_batches(vocab, seq, b, args.steps, tmp / f"batches-{seq}-{b}.json")
                cmd = side_command(side, path, model_dir, args.warmup, point_bf16,
                                   {"max_seq_length": seq, **overrides})
                load = os.getloadavg()[0]
                spawned = time.time()
                res, rss, wall = run_measured(cmd, env)
                res["load_avg_1min_before"] = load
                res["startup_s"] = res.pop("first_step_end_unix") - spawned
                res["wall_s"] = wall
                out = figures(res, rss, b, seq, flops, max(probes[point_precision]))
                print(f"  {side:8s} batch {b:3d}: {out['examples_per_s']:7.2f} ex/s "
                      f"{out['tokens_per_s']:8.0f} tok/s  peak RSS {out['peak_rss_gib']:5.2f} "
                      f"GiB  MFU {out['mfu']:.1%}  ({wall:.0f} s, load {load:.1f})", flush=True)
                return out

            if batch is not None:
                runs = {side: [] for side in sides}
                for r in range(args.repeats):
                    order = sides if (r + index) % 2 == 0 else sides[::-1]
                    for side in order:
                        runs[side].append(run(side, batch))
                for side, rs in runs.items():
                    point["sides"][side] = {
                        "median_examples_per_s": common.median([x["examples_per_s"] for x in rs]),
                        "median_tokens_per_s": common.median([x["tokens_per_s"] for x in rs]),
                        "median_mfu": common.median([x["mfu"] for x in rs]),
                        "peak_rss_bytes": max(x["peak_rss_bytes"] for x in rs),
                        "peak_rss_gib": max(x["peak_rss_gib"] for x in rs),
                        "runs": rs}
                if {"bertflow", "peer"} <= set(runs):
                    point["ratio_bertflow_vs_peer"] = (
                        point["sides"]["bertflow"]["median_examples_per_s"]
                        / point["sides"]["peer"]["median_examples_per_s"])
                    point["rss_ratio_bertflow_vs_peer"] = (
                        point["sides"]["bertflow"]["peak_rss_bytes"]
                        / point["sides"]["peer"]["peak_rss_bytes"])
            measured = [(batch, x["peak_rss_bytes"])
                        for x in point["sides"].get("bertflow", {}).get("runs", [])]
            if "bertflow" in sides:
                for b in memory_batches:
                    out = run("bertflow", b)
                    point["memory_runs"].append({"batch": b, **out})
                    measured.append((b, out["peak_rss_bytes"]))
            point["measured_peak_rss"] = [{"batch": b, "bytes": rss} for b, rss in measured]
            score(point, {p: max(v) for p, v in probes.items() if v})
            lb = point["largest_batch_24gib"]
            print(f"  largest per-replica batch in 24 GiB (computed): {lb['no_accumulation']} "
                  f"without accumulation, {lb['with_accumulation']} per micro-batch with it"
                  f" (line through measured points: {lb['from_measured_line']})", flush=True)
            points.append(point)
            if not any(later[0] == name for later in PRESETS[args.preset][index + 1:]):
                shutil.rmtree(model_dir, ignore_errors=True)  # bert-large's is 1.3 GB

    best = {p: max(v) for p, v in probes.items() if v}
    for point in points:  # MFU against the best probe of the whole invocation
        score(point, best)
    summary = summarize(points)
    for p in points:
        if "ratio_bertflow_vs_peer" in p:
            print(f"{p['model']} seq {p['max_seq_length']} batch {p['batch']}: bertflow "
                  f"x{p['ratio_bertflow_vs_peer']:.2f} the peer's examples/s, peak RSS "
                  f"x{p['rss_ratio_bertflow_vs_peer']:.2f}")
    common.write_results(args.name, {
        "smoke": args.smoke,
        "weights": "RANDOM: no bert-base or bert-large weights ship offline; speed and memory "
                   "depend on the shapes only",
        "data": "synthetic rows of random whole-word tokens, each truncated to max_seq_length",
        "preset": args.preset, "repeats": args.repeats, "timed_steps": args.steps,
        "warmup_steps": args.warmup, "sides": sides,
        "precision": {"cpu_native_bf16": bf16,
                      "bertflow": "mixed_precision auto (mixed_bfloat16 on native bf16)",
                      "peer": f"torch fused AdamW (adamw_torch_fused), "
                              f"{'bf16 autocast' if bf16 else 'float32'}"},
        "peak_gflop_per_s": {p: {"best": max(v), "median": common.median(v)}
                             for p, v in probes.items() if v},
        "default_precision": precision,
        "estimate_error": summary,
        "measured_limit_bytes": MEASURED_LIMIT,
        "seconds": time.perf_counter() - t_start,
        "points": points})


if __name__ == "__main__":
    main()
