"""TensorFlow side of train_throughput: tf-keras Model.fit on transformers'
TFBertForSequenceClassification, fed the driver's batches. Knobs: precision, XLA, padding
multiple (bucketing), threads, steps_per_execution. Prints one line `RESULT {json}`.

Warm-up = one step per distinct padded shape (so XLA/oneDNN compile time is excluded), then
every batch is timed once."""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

p = argparse.ArgumentParser()
p.add_argument("--batches", required=True)
p.add_argument("--model-dir", required=True)
p.add_argument("--precision", choices=["fp32", "bf16", "amp"], default="fp32",
               help="bf16: Keras mixed_bfloat16 policy. amp: float32 policy + grappler's "
                    "auto_mixed_precision_onednn_bfloat16 graph rewrite")
p.add_argument("--jit", type=int, default=0)
p.add_argument("--pad-multiple", type=int, default=1)
p.add_argument("--intra", type=int, default=0)
p.add_argument("--inter", type=int, default=0)
p.add_argument("--spe", type=int, default=1, help="steps_per_execution")
p.add_argument("--opt-jit", type=int, default=1, help="tf_keras AdamW jit_compile")
p.add_argument("--optimizer", choices=["keras_adamw", "fused_adamw"], default="keras_adamw",
               help="keras_adamw: tf_keras.optimizers.AdamW. fused_adamw: transformers'"
                    " AdamWeightDecay (legacy Adam = one fused ResourceApplyAdam kernel per"
                    " variable) with the embedding's sparse gradient densified first")
a = p.parse_args()

import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from trainbench_data import padded_arrays, padded_len, train_flops  # noqa: E402

if a.intra:
    tf.config.threading.set_intra_op_parallelism_threads(a.intra)
if a.inter:
    tf.config.threading.set_inter_op_parallelism_threads(a.inter)
tf.keras.utils.set_random_seed(0)
if a.precision == "bf16":
    tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")
if a.precision == "amp":
    tf.config.optimizer.set_experimental_options({"auto_mixed_precision_onednn_bfloat16": True})

from safetensors.numpy import load_file  # noqa: E402
from transformers import BertConfig, TFBertForSequenceClassification  # noqa: E402
from transformers.modeling_tf_pytorch_utils import load_pytorch_state_dict_in_tf2_model  # noqa

config = BertConfig.from_pretrained(a.model_dir, num_labels=2)
model = TFBertForSequenceClassification(config)
model(model.dummy_inputs, training=False)
sd = {("bert." + k if not k.startswith("bert.") else k): v
      for k, v in load_file(os.path.join(a.model_dir, "model.safetensors")).items()}
load_pytorch_state_dict_in_tf2_model(model, sd, allow_missing_keys=True,
                                     skip_logger_warnings=True)
if a.optimizer == "fused_adamw":
    from transformers.optimization_tf import AdamWeightDecay

    class DenseAdamWeightDecay(AdamWeightDecay):
        """Sparse (embedding) gradients are summed into a dense tensor so every variable
        takes the fused dense kernel; the update is the same dense AdamW torch does."""

        def _resource_apply_sparse_duplicate_indices(self, grad, var, indices, **kwargs):
            dense = tf.math.unsorted_segment_sum(grad, indices, tf.shape(var)[0])
            return self._resource_apply_dense(dense, var, **kwargs)

    opt = DenseAdamWeightDecay(learning_rate=2e-5, weight_decay_rate=0.01,
                               exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"])
else:
    opt = tf_keras.optimizers.AdamW(learning_rate=2e-5, weight_decay=0.01,
                                    jit_compile=bool(a.opt_jit))
model.compile(optimizer=opt,
              loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              jit_compile=bool(a.jit), steps_per_execution=a.spe)

batches = json.load(open(a.batches))["batches"]


def to_arrays(b):
    return padded_arrays(b, a.pad_multiple)


seen, warm = set(), []
for b in batches:
    n = padded_len(b, a.pad_multiple)
    if n not in seen:
        seen.add(n)
        warm.append(b)
# steps_per_execution groups steps: pad the warm-up to a multiple so timing starts cleanly.
while len(warm) % a.spe:
    warm.append(warm[-1])
timed = batches[: len(batches) // a.spe * a.spe]
arrays = [to_arrays(b) for b in warm + timed]
spec = ({k: tf.TensorSpec([None, None], tf.int32) for k in arrays[0][0]},
        tf.TensorSpec([None], tf.int32))
ds = tf.data.Dataset.from_generator(lambda: iter(arrays), output_signature=spec)
ds = ds.prefetch(2)


class Clock(tf_keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.ends = []

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append((batch, time.perf_counter(), logs.get("loss") if logs else None))


clock = Clock()
t_fit = time.perf_counter()
model.fit(ds, epochs=1, steps_per_epoch=len(arrays), verbose=0, callbacks=[clock])
t_fit = time.perf_counter() - t_fit
# clock.ends holds one entry per execution; the batch index is the last step of it.
w = len(warm)
start = next(t for (bi, t, _) in clock.ends if bi == w - 1)
end = clock.ends[-1][1]
dt = end - start
n_ex = sum(len(b["labels"]) for b in timed)
tokens = sum(len(b["labels"]) * padded_len(b, a.pad_multiple) for b in timed)
sq = sum(len(b["labels"]) * padded_len(b, a.pad_multiple) ** 2 for b in timed)
flops = train_flops(tokens, n_ex, sq)
print("RESULT " + json.dumps({
    "examples_per_s": n_ex / dt, "seconds": dt, "steps": len(timed), "examples": n_ex,
    "warmup_steps": w, "distinct_shapes": len(seen), "padded_tokens": tokens,
    "train_gflop_per_s": flops / dt / 1e9, "fit_total_s": t_fit,
    "final_loss": float(clock.ends[-1][2]) if clock.ends[-1][2] is not None else None,
    "tf": tf.__version__, "args": vars(a)}))
sys.stdout.flush()
