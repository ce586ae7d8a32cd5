"""Swap BERT's dropout, LayerNorm and GELU onto bertflow's CPU kernels (tasks/training/cpu_kernels),
same variables and names, so checkpoints are untouched.

Layers keep their class's behaviour where the kernels do not apply: dropout with a
noise_shape, LayerNorm over other axes or without scale/offset, and dtypes other than float32
and bfloat16 (float16) go to the stock implementation.
"""
from __future__ import annotations

import tensorflow as tf
import tf_keras
from transformers.models.bert import modeling_tf_bert as hf_bert

from tasks.training import cpu_kernels, float32_gelu, seeded_dropout

KERNEL_DTYPES = (tf.float32, tf.bfloat16)


class KernelDropout(seeded_dropout.SeededDropout):
    """The kernel draws its mask from the seed pair it is given: `seed_fn()` once
    seeded_dropout.apply_to has run (training), else a pair from TensorFlow's stateful RNG."""

    def call(self, inputs, training=None):
        if self.noise_shape is not None or inputs.dtype not in KERNEL_DTYPES:
            return super().call(inputs, training=training)
        seed = self.seed_fn
        return self._drop(inputs, training, lambda: cpu_kernels.dropout(
            inputs, self.rate, seed() if seed is not None else None))


class KernelLayerNorm(tf_keras.layers.LayerNormalization):
    def call(self, inputs):
        last = inputs.shape.rank - 1
        if (not (self.center and self.scale) or list(self.axis) not in ([-1], [last])
                or inputs.dtype not in KERNEL_DTYPES):
            return super().call(inputs)
        # The float32 variables themselves: reading them under mixed precision would round
        # gamma and beta to bfloat16.
        gamma = getattr(self.gamma, "_variable", self.gamma)
        beta = getattr(self.beta, "_variable", self.beta)
        return cpu_kernels.layer_norm(inputs, gamma, beta, self.epsilon)


def kernel_gelu(x: tf.Tensor) -> tf.Tensor:
    if x.dtype not in KERNEL_DTYPES:
        return hf_bert.get_tf_activation("gelu")(x)
    return cpu_kernels.gelu(x)


def apply_to(model) -> None:
    for layer in model.submodules:
        if type(layer) is tf_keras.layers.Dropout:
            layer.__class__ = KernelDropout
        elif type(layer) is tf_keras.layers.LayerNormalization:
            layer.__class__ = KernelLayerNorm
    float32_gelu.apply_to(model, kernel_gelu)
