"""Cheaper computation for three parts of transformers' TensorFlow BERT, with the same weights.

`speed_up(model)` swaps the class of some sub-layers of a built TFBertForSequenceClassification
for subclasses that only override `call`. Variables, their names and checkpoints are
untouched, so `save_pretrained`, `from_pretrained` and tf.train.Checkpoint see the same model.
Each change was measured on a MiniLM training step (benchmarks/RESULTS.md, "model-level"):

- Embeddings: under a mixed-precision policy, reading the 30522 x H word-embedding variable
  casts the whole table to the compute dtype every step before gathering a few hundred rows.
  Gathering from the float32 table first and casting the rows is the same value.
- GELU: the exact (erf) GELU in bfloat16 runs through Eigen's slow scalar bfloat16 path; it is
  computed in float32 and cast back, which is also more precise.
- Dropout: keras draws one 32-bit random number per element. Here one 32-bit draw gives two
  16-bit uniforms, each element is kept when its 16-bit value is at least
  round(rate * 65536), so the drop probability is the rate to within 1/131072 (0.1 becomes
  0.100006), and kept values are scaled by 1 / (1 - rate) as before.
"""
from __future__ import annotations

import tensorflow as tf
import tf_keras
from transformers.models.bert import modeling_tf_bert as hf_bert


def speed_up(model) -> None:
    for layer in model.submodules:
        if type(layer) is hf_bert.TFBertEmbeddings:
            layer.__class__ = _Embeddings
        elif type(layer) is hf_bert.TFBertIntermediate:
            if layer.intermediate_act_fn is hf_bert.get_tf_activation("gelu"):
                layer.intermediate_act_fn = gelu_in_float32
        elif type(layer) is tf_keras.layers.Dropout and layer.noise_shape is None:
            layer.__class__ = _Dropout


def gelu_in_float32(x: tf.Tensor) -> tf.Tensor:
    return tf.cast(tf.nn.gelu(tf.cast(x, tf.float32), approximate=False), x.dtype)


def dropout_16bit(x: tf.Tensor, rate: float, seed: int | None = None) -> tf.Tensor:
    size = tf.size(x)
    words = tf.random.uniform([(size + 1) // 2], minval=-2**31, maxval=2**31 - 1,
                              dtype=tf.int32, seed=seed)
    halves = tf.reshape(tf.bitcast(words, tf.uint16), [-1])[:size]
    keep = tf.reshape(halves >= round(rate * 65536), tf.shape(x))
    return tf.where(keep, x * tf.cast(1.0 / (1.0 - rate), x.dtype), tf.zeros_like(x))


def _storage(variable):
    """The float32 variable behind a mixed-precision AutoCastVariable."""
    return getattr(variable, "_variable", variable)


class _Embeddings(hf_bert.TFBertEmbeddings):
    def call(self, input_ids=None, position_ids=None, token_type_ids=None, inputs_embeds=None,
             past_key_values_length=0, training=False):
        if input_ids is None or inputs_embeds is not None or past_key_values_length:
            return super().call(input_ids, position_ids, token_type_ids, inputs_embeds,
                                past_key_values_length, training)
        hf_bert.check_embeddings_within_bounds(input_ids, self.config.vocab_size)
        if token_type_ids is None:
            token_type_ids = tf.zeros_like(input_ids)
        if position_ids is None:
            position_ids = tf.range(tf.shape(input_ids)[1])[tf.newaxis]

        def rows(table, ids):
            return tf.cast(tf.gather(_storage(table), ids), self.compute_dtype)

        embeddings = (rows(self.weight, input_ids) + rows(self.position_embeddings, position_ids)
                      + rows(self.token_type_embeddings, token_type_ids))
        embeddings = self.LayerNorm(inputs=embeddings)
        return self.dropout(inputs=embeddings, training=training)


class _Dropout(tf_keras.layers.Dropout):
    def call(self, inputs, training=None):
        if training is None:
            training = tf_keras.backend.learning_phase()
        if self.rate == 0:
            return tf.identity(inputs)
        return tf.__internal__.smart_cond.smart_cond(
            training, lambda: dropout_16bit(inputs, self.rate, self.seed),
            lambda: tf.identity(inputs))
