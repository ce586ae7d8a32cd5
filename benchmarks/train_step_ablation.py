"""What each training speed-up is worth: bertflow's train step with parts switched off.

    ./.venv/bin/python benchmarks/train_step_ablation.py [--examples 960] [--repeats 2] [--smoke]

`--smoke`: a tiny random model on 12 synthetic rows, the `bertflow`, `clip_pass` and
`tf_kernels` variants, one run each, results in a temporary folder (common.smoke_results_dir).

One in-process training step (GradientTape, the project's optimizer and layers on MiniLM
under mixed_bfloat16) timed over the same length-grouped SST-2 batches as
train_throughput.py, without Keras fit, tf.data or checkpoints, so the differences are the
model and optimizer alone. Each variant runs in its own process, alternating, and the figure
is the median examples/s. Every variant clips the gradient to the product's default global
norm (tasks.config.DEFAULT_CLIP_NORM; the file's `clip_norm`). Variants, each one step further
from the product:
    bertflow            the product on CPU: bertflow's CPU kernels (tasks/model/cpu_kernels) for
                        AdamW, dropout, GELU and LayerNorm; the AdamW kernel scales each
                        gradient by the clipping factor as it reads it
    clip_pass           the same, but clipping in a pass of its own before the kernel (Keras'
                        tf.clip_by_global_norm, which writes a scaled copy of each gradient)
    tf_kernels          without them: tasks.training.model.AdamW on TensorFlow's fused kernels and
                        the GELU in float32 (the product where the kernels are not built)
    bf16_gelu           the same with the GELU in the compute dtype (bfloat16 under this policy)
    keras_adamw         tf_keras.optimizers.AdamW and the GELU in the compute dtype
With --profile each run also reports the op time per step (TensorFlow profiler), summed over
threads and by op type: a measure of work that a shared CPU disturbs less than wall time.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lib import common
from lib import trainbench_data

VARIANTS = ["bertflow", "clip_pass", "tf_kernels", "bf16_gelu", "keras_adamw"]


def worker(variant: str, batches_path: Path, model_dir: str, warmup: int = 3,
           profile: bool = False, precision: str = "mixed_bfloat16") -> dict:
    import tasks  # noqa: F401  (TensorFlow's settings of every bertflow process, before TF)
    import tensorflow as tf
    import tf_keras

    from tasks.config import DEFAULT_CLIP_NORM
    from tasks.model import cpu_kernels
    from tasks.training import checkpoint, model as model_lib

    tf_keras.mixed_precision.set_global_policy(precision)
    tf_keras.utils.set_random_seed(0)
    kernels = variant in ("bertflow", "clip_pass")
    if kernels and not cpu_kernels.available():
        raise SystemExit("bertflow CPU kernels are not built: run `make install`")
    gelu = "kernel" if kernels else {"tf_kernels": "float32"}.get(variant, "native")
    model = checkpoint.load_classifier(model_dir, ["0", "1"], cpu_kernels=kernels, gelu=gelu)
    if variant == "keras_adamw":
        optimizer = tf_keras.optimizers.AdamW(learning_rate=2e-5, weight_decay=0.01,
                                              epsilon=1e-6, global_clipnorm=DEFAULT_CLIP_NORM)
    else:
        class ClipPassAdamW(model_lib.AdamW):
            """The clipping as Keras does it (tf.clip_by_global_norm in apply_gradients) and
            a factor of 1 for the kernel: what the product did before its kernel took it."""
            def _transform_gradients(self, grads_and_vars):
                grads_and_vars = tf_keras.optimizers.legacy.Adam._transform_gradients(
                    self, grads_and_vars)
                self._clip_factor = tf.ones([])
                return grads_and_vars

        adamw = ClipPassAdamW if variant == "clip_pass" else model_lib.AdamW
        optimizer = adamw(learning_rate=2e-5, weight_decay=0.01, epsilon=1e-6,
                          exclude_from_weight_decay=model_lib.NO_DECAY, cpu_kernel=kernels,
                          global_clipnorm=DEFAULT_CLIP_NORM)
    loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    spec = ({k: tf.TensorSpec([None, None], tf.int32)
             for k in ("input_ids", "attention_mask", "token_type_ids")},
            tf.TensorSpec([None], tf.int32))

    @tf.function(input_signature=spec, reduce_retracing=True)
    def step(features, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(features, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    batches = [tf.nest.map_structure(tf.constant, trainbench_data.padded_arrays(b))
               for b in json.loads(batches_path.read_text())["batches"]]
    for features, labels in batches[:warmup]:
        step(features, labels)
    with tempfile.TemporaryDirectory() as trace_dir:
        if profile:
            tf.profiler.experimental.start(trace_dir)
        t0 = time.perf_counter()
        for features, labels in batches:
            loss = step(features, labels)
        float(loss)
        seconds = time.perf_counter() - t0
        result = {"examples_per_s": sum(int(y.shape[0]) for _, y in batches) / seconds,
                  "seconds": seconds, "clip_norm": DEFAULT_CLIP_NORM}
        if profile:
            tf.profiler.experimental.stop()
            result["op_ms_per_step"] = op_times(Path(trace_dir), len(batches))
    return result


def op_times(trace_dir: Path, steps: int) -> dict[str, float]:
    """Milliseconds per step spent in each TensorFlow op type, summed over the executor's
    threads (so it measures work, which the shared CPU disturbs less than wall time)."""
    from collections import Counter

    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(next(trace_dir.rglob("*.xplane.pb")).read_bytes())
    host = next(plane for plane in space.planes if plane.name == "/host:CPU")
    totals: Counter = Counter()
    for line in host.lines:
        if line.name.startswith("tf_Compute"):  # executor threads: one event per op run
            for event in line.events:
                op = host.event_metadata[event.metadata_id].name.rsplit(":", 1)[-1]
                if op != "Process":
                    totals[op] += event.duration_ps / 1e9 / steps
    return {"total": round(sum(totals.values()), 1),
            **{op: round(ms, 2) for op, ms in totals.most_common(15)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=960)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--profile", action="store_true",
                    help="also trace the timed pass and report op time per step by op type "
                         "(the tracer slows the step a little)")
    ap.add_argument("--precision", default="mixed_bfloat16",
                    choices=["mixed_bfloat16", "float32"],
                    help="float32 is what mixed_precision auto picks on CPUs without bfloat16")
    ap.add_argument("--smoke", action="store_true",
                    help="a tiny random model, 12 synthetic rows, 2 variants, one run each, "
                         "results in a temporary folder ($BERTFLOW_BENCH_RESULTS_DIR)")
    ap.add_argument("--worker", nargs=3, metavar=("VARIANT", "BATCHES", "MODEL_DIR"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        variant, batches, model_dir = args.worker
        print("RESULT " + json.dumps(worker(variant, Path(batches), model_dir,
                                            profile=args.profile,
                                            precision=args.precision)), flush=True)
        return
    if args.smoke:
        common.smoke_results_dir()
        args.repeats, args.examples = 1, 12
        if args.variants == ",".join(VARIANTS):
            args.variants = "bertflow,clip_pass,tf_kernels"
    else:
        common.require_data("sst2/train.tsv")  # before any work
    names = args.variants.split(",")
    runs: dict[str, list[float]] = {n: [] for n in names}
    clip_norms = set()
    op_ms: dict[str, list[dict]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, bpath = trainbench_data.model_and_batches(Path(tmp), args.examples,
                                                             args.smoke)
        for r in range(args.repeats):
            for n in (names if r % 2 == 0 else names[::-1]):
                proc = subprocess.run(
                    [sys.executable, __file__, "--worker", n, str(bpath), model_dir,
                     "--precision", args.precision,
                     *(["--profile"] if args.profile else [])],
                    capture_output=True, text=True, cwd=common.PROJECT_ROOT)
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
                if proc.returncode or not lines:
                    raise RuntimeError(f"{n} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
                res = json.loads(lines[-1][len("RESULT "):])
                runs[n].append(res["examples_per_s"])
                clip_norms.add(res["clip_norm"])
                work = ""
                if "op_ms_per_step" in res:
                    op_ms[n].append(res["op_ms_per_step"])
                    work = f", {res['op_ms_per_step']['total']:.0f} op-ms per step"
                print(f"  [{r + 1}/{args.repeats}] {n:14s} {runs[n][-1]:6.1f} ex/s{work}",
                      flush=True)
    base = common.median(runs[names[0]])
    summary = {n: {"median_examples_per_s": common.median(v), "runs": v,
                   "vs_" + names[0]: common.median(v) / base} for n, v in runs.items()}
    for n, s in summary.items():
        if op_ms[n]:
            s["median_op_ms_per_step"] = common.median([x["total"] for x in op_ms[n]])
            s["op_ms_per_step_runs"] = op_ms[n]
        work = f"  {s['median_op_ms_per_step']:.0f} op-ms/step" if op_ms[n] else ""
        print(f"  {n:14s} {s['median_examples_per_s']:6.1f} ex/s  x{s['vs_' + names[0]]:.2f}"
              f"{work}")
    suffix = ("_profiled" if args.profile else "") + (
        "_float32" if args.precision == "float32" else "")
    common.write_results("train_step_ablation" + suffix,
                         {"smoke": args.smoke, "examples": args.examples,
                          "repeats": args.repeats, "clip_norm": clip_norms.pop(),
                          "precision": args.precision, "summary": summary})


if __name__ == "__main__":
    main()
