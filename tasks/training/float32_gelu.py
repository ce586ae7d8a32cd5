"""GELU in float32 for transformers' TensorFlow BERT, same weights.

Under mixed_bfloat16, the exact (erf) GELU of every feed-forward layer runs Eigen's bfloat16
`Erfc`, which is slow on CPUs: 17-20 ms of op time per MiniLM training step at batch 32,
against 5 ms in float32 plus 5 ms for the two casts (benchmarks/RESULTS.md, section 2). The
float32 result, cast back, is also the more precise one. The activation is a plain attribute
of the layer, so variables, names and checkpoints are untouched.

Two other changes were measured and left out: casting gathered embedding rows instead of the
whole table (no measurable gain) and 16-bit dropout draws (about 1%).
"""
from __future__ import annotations

import tensorflow as tf
from transformers.models.bert import modeling_tf_bert as hf_bert


def apply_to(model, activation=None) -> None:
    """Replace the exact GELU of every feed-forward layer with `activation` (default: this
    module's float32 GELU)."""
    for layer in model.submodules:
        if (isinstance(layer, hf_bert.TFBertIntermediate)
                and layer.intermediate_act_fn is hf_bert.get_tf_activation("gelu")):
            layer.intermediate_act_fn = activation or gelu


def gelu(x: tf.Tensor) -> tf.Tensor:
    return tf.cast(tf.nn.gelu(tf.cast(x, tf.float32), approximate=False), x.dtype)
