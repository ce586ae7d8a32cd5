"""The encoder's building blocks as tf_keras layers.

Every choice (CPU kernels, which GELU, dropout numbering) is made when a layer is built, by
the model's `LayerFactory`; nothing is swapped in afterwards. Layers follow the global
mixed-precision policy: float32 variables, computation in the policy's compute dtype.
"""
from __future__ import annotations

import copy
import itertools
import math

import tensorflow as tf
import tf_keras

from tasks.model import cpu_kernels

# The dtypes bertflow's CPU kernels take; others (float16) use TensorFlow's ops.
KERNEL_DTYPES = (tf.float32, tf.bfloat16)


class LayerNorm(tf_keras.layers.LayerNormalization):
    """LayerNormalization over the last axis, on bertflow's CPU kernel when `use_cpu_kernel`."""

    def __init__(self, epsilon: float, use_cpu_kernel: bool = False, **kwargs):
        super().__init__(epsilon=epsilon, **kwargs)
        self.use_cpu_kernel = use_cpu_kernel

    def call(self, inputs):
        if not self.use_cpu_kernel or inputs.dtype not in KERNEL_DTYPES:
            return super().call(inputs)
        # The float32 variables themselves: reading them under mixed precision would round
        # gamma and beta to bfloat16.
        gamma = getattr(self.gamma, "_variable", self.gamma)
        beta = getattr(self.beta, "_variable", self.beta)
        return cpu_kernels.layer_norm(inputs, gamma, beta, self.epsilon)


class Dropout(tf_keras.layers.Dropout):
    """Dropout whose masks can be a function of checkpointed state.

    `index` is the layer's place in the model's construction order. Once the model's
    `seed_dropout` has given it a seed source (tasks/training/seeded_dropout.DropoutSeeds),
    each mask is drawn statelessly from `seeds.seed(index)`, so a resumed run draws the
    masks an uninterrupted one draws. Without one, masks come from TensorFlow's stateful RNG.
    """

    def __init__(self, rate: float, index: int, use_cpu_kernel: bool = False, **kwargs):
        super().__init__(rate, **kwargs)
        self.index, self.use_cpu_kernel = index, use_cpu_kernel
        self.seeds = None

    def set_seeds(self, seeds) -> None:
        # Not a Keras attribute: the seed source reads the optimizer's step variable, which
        # must not become one of the model's tracked weights.
        object.__setattr__(self, "seeds", seeds)

    def call(self, inputs, training=None):
        if self.rate == 0:
            return inputs
        if training is None:
            training = tf_keras.backend.learning_phase()
        return tf.__internal__.smart_cond.smart_cond(
            training, lambda: self._drop(inputs), lambda: tf.identity(inputs))

    def _drop(self, inputs):
        seed = None if self.seeds is None else self.seeds.seed(self.index)
        if self.use_cpu_kernel and inputs.dtype in KERNEL_DTYPES:
            return cpu_kernels.dropout(inputs, self.rate, seed)
        if seed is None:
            return self._random_generator.dropout(inputs, self.rate)
        return tf.nn.experimental.stateless_dropout(inputs, self.rate, seed)


def native_gelu(x: tf.Tensor) -> tf.Tensor:
    return tf.nn.gelu(x, approximate=False)


def float32_gelu(x: tf.Tensor) -> tf.Tensor:
    """Exact GELU computed in float32: bfloat16's erf is slow on CPUs (slower than float32's
    with the casts, in a profile that left no results file), and less precise."""
    if x.dtype == tf.float32:
        return native_gelu(x)
    return tf.cast(native_gelu(tf.cast(x, tf.float32)), x.dtype)


def kernel_gelu(x: tf.Tensor) -> tf.Tensor:
    if x.dtype not in KERNEL_DTYPES:
        return float32_gelu(x)
    return cpu_kernels.gelu(x)


def tanh_gelu(x: tf.Tensor) -> tf.Tensor:
    """transformers' "gelu_new": the tanh approximation."""
    return tf.nn.gelu(x, approximate=True)


GELUS = {"kernel": kernel_gelu, "float32": float32_gelu, "native": native_gelu}


class Dense(tf_keras.layers.Dense):
    """Keras' Dense, with [batch, seq, features] inputs multiplied as [batch * seq, features]
    rows: the reshape, MatMul and reshape that `tf.tensordot` makes of them, without its
    shape arithmetic and identity transposes. The kernels that run are the same; the graph
    of a training step is smaller by about 25 ops per layer, forward and backward, which
    every process pays for in tracing and graph optimization."""

    def call(self, inputs):
        if not isinstance(inputs, tf.Tensor) or inputs.shape.rank != 3:
            return super().call(inputs)
        if inputs.dtype.base_dtype != self._compute_dtype_object.base_dtype:
            inputs = tf.cast(inputs, self._compute_dtype_object)
        batch = tf.shape(inputs)[0]
        rows = tf.matmul(tf.reshape(inputs, [-1, inputs.shape[-1]]), self.kernel)
        outputs = tf.reshape(rows, [batch, -1, self.units])
        outputs.set_shape(inputs.shape[:-1].concatenate([self.units]))
        if self.use_bias:
            outputs = tf.nn.bias_add(outputs, self.bias)
        return outputs if self.activation is None else self.activation(outputs)


class LayerFactory:
    """Makes the layers of one model with its choices: CPU kernels or not, the GELU
    variant, normal(initializer_range) initial kernels as transformers' models have, and
    dropout layers numbered in the order they are made."""

    def __init__(self, initializer_range: float, gelu: str, use_cpu_kernels: bool):
        if gelu not in GELUS:
            raise ValueError(f"gelu must be one of {', '.join(GELUS)}, not {gelu!r}")
        self.initializer_range, self.use_cpu_kernels = initializer_range, use_cpu_kernels
        self.gelu = GELUS[gelu]
        self._dropout_index = itertools.count()
        self.zero_kernels = False

    def for_loaded_weights(self) -> "LayerFactory":
        """The same factory (one dropout numbering) for layers whose every weight a
        checkpoint overwrites: their kernels and embeddings start at zero. Drawing
        BERT-base's 110M normal values only to overwrite them took most of a second of
        every process that loads a model."""
        factory = copy.copy(self)
        factory.zero_kernels = True
        return factory

    def initializer(self) -> tf_keras.initializers.Initializer:
        if self.zero_kernels:
            return tf_keras.initializers.Zeros()
        # A new object per weight: an unseeded initializer called twice repeats its values.
        return tf_keras.initializers.RandomNormal(stddev=self.initializer_range)

    def dense(self, units: int, name: str, activation=None) -> Dense:
        return Dense(units, activation=activation, name=name,
                     kernel_initializer=self.initializer())

    def layer_norm(self, epsilon: float, name: str) -> LayerNorm:
        return LayerNorm(epsilon, self.use_cpu_kernels, name=name)

    def dropout(self, rate: float, name: str = "dropout") -> Dropout:
        return Dropout(rate, next(self._dropout_index), self.use_cpu_kernels, name=name)

    def activation(self, name: str):
        """The callable of a config's hidden_act ("gelu" is exact, erf-based GELU), or of
        "tanh" (RoBERTa's classification head)."""
        return {"gelu": self.gelu, "gelu_new": tanh_gelu, "relu": tf.nn.relu,
                "tanh": tf.math.tanh}[name]


def attention_bias(mask: tf.Tensor | None, dtype: tf.DType) -> tf.Tensor | None:
    """[batch, 1, 1, seq] additive bias: 0 where mask is 1, the dtype's lowest value where it
    is 0, as transformers' PyTorch BERT, DistilBERT and ELECTRA build it."""
    if mask is None:
        return None
    mask = tf.cast(mask[:, tf.newaxis, tf.newaxis, :], dtype)
    return (1 - mask) * dtype.min


class SelfAttention(tf_keras.layers.Layer):
    """Multi-head self-attention with its output projection (BERT's attention.self and
    attention.output.dense; DistilBERT's q_lin, k_lin, v_lin and out_lin)."""

    def __init__(self, hidden_size: int, num_heads: int, dropout_rate: float,
                 make: LayerFactory, **kwargs):
        super().__init__(**kwargs)
        self.num_heads, self.head_size = num_heads, hidden_size // num_heads
        self.query = make.dense(hidden_size, "query")
        self.key = make.dense(hidden_size, "key")
        self.value = make.dense(hidden_size, "value")
        self.probs_dropout = make.dropout(dropout_rate, "probs_dropout")
        self.output_dense = make.dense(hidden_size, "output_dense")

    def call(self, hidden, bias, training=None):
        batch = tf.shape(hidden)[0]
        # Scaling the queries, not the [batch, heads, seq, seq] scores: the same result
        # (DistilBERT's order), over a tensor seq/head_size times smaller.
        query = self._split_heads(self.query(hidden) * (1 / math.sqrt(self.head_size)), batch)
        key = self._split_heads(self.key(hidden), batch)
        value = self._split_heads(self.value(hidden), batch)
        scores = tf.matmul(query, key, transpose_b=True)
        if bias is not None:
            scores += bias
        probs = self.probs_dropout(tf.nn.softmax(scores, axis=-1), training=training)
        context = tf.transpose(tf.matmul(probs, value), [0, 2, 1, 3])
        context = tf.reshape(context, [batch, -1, self.num_heads * self.head_size])
        return self.output_dense(context)

    def _split_heads(self, x, batch):
        """[batch, seq, hidden] -> [batch, heads, seq, head_size]."""
        x = tf.reshape(x, [batch, -1, self.num_heads, self.head_size])
        return tf.transpose(x, [0, 2, 1, 3])


class FeedForward(tf_keras.layers.Layer):
    """Dense, activation, Dense, dropout (BERT's intermediate and output.dense; DistilBERT's
    ffn)."""

    def __init__(self, hidden_size: int, intermediate_size: int, activation: str,
                 dropout_rate: float, make: LayerFactory, **kwargs):
        super().__init__(**kwargs)
        self.intermediate = make.dense(intermediate_size, "intermediate")
        self.activation = make.activation(activation)
        self.output_dense = make.dense(hidden_size, "output_dense")
        self.dropout = make.dropout(dropout_rate)

    def call(self, hidden, training=None):
        hidden = self.activation(self.intermediate(hidden))
        return self.dropout(self.output_dense(hidden), training=training)


class TransformerBlock(tf_keras.layers.Layer):
    """Post-LN transformer layer: LayerNorm(x + attention(x)), then LayerNorm(h + ffn(h)).

    `attention_output_dropout` is False for DistilBERT, which has no dropout between the
    attention's output projection and its LayerNorm (BERT and ELECTRA have one). `attention`:
    another attention layer than SelfAttention (DeBERTa's), called as (hidden, bias) where
    `bias` is whatever the encoder passes the blocks."""

    def __init__(self, config, make: LayerFactory, attention_output_dropout: bool = True,
                 attention: tf_keras.layers.Layer | None = None, **kwargs):
        super().__init__(**kwargs)
        self.attention = attention or SelfAttention(config.hidden_size, config.num_heads,
                                                    config.attention_dropout, make,
                                                    name="attention")
        self.attention_dropout = (make.dropout(config.hidden_dropout, "attention_dropout")
                                  if attention_output_dropout else None)
        self.attention_layer_norm = make.layer_norm(config.layer_norm_eps,
                                                    "attention_layer_norm")
        self.feed_forward = FeedForward(config.hidden_size, config.intermediate_size,
                                        config.hidden_act, config.hidden_dropout, make,
                                        name="feed_forward")
        self.output_layer_norm = make.layer_norm(config.layer_norm_eps, "output_layer_norm")

    def call(self, hidden, bias, training=None):
        attended = self.attention(hidden, bias, training=training)
        if self.attention_dropout is not None:
            attended = self.attention_dropout(attended, training=training)
        hidden = self.attention_layer_norm(attended + hidden)
        return self.output_layer_norm(self.feed_forward(hidden, training=training) + hidden)


class Embeddings(tf_keras.layers.Layer):
    """Word + position (+ token type) embeddings, LayerNorm and dropout, at embedding_size;
    then ELECTRA's projection to hidden_size when the two differ. `absolute_positions`
    False: no position table (DeBERTa-v3's positions are relative, in its attention)."""

    def __init__(self, config, make: LayerFactory, absolute_positions: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.config, self.make = config, make
        self.absolute_positions = absolute_positions
        self.layer_norm = make.layer_norm(config.layer_norm_eps, "layer_norm")
        self.dropout = make.dropout(config.hidden_dropout)
        self.projection = (make.dense(config.hidden_size, "projection")
                           if config.embedding_size != config.hidden_size else None)

    def build(self, input_shape):
        c = self.config
        self.word_embeddings = self.add_weight(
            "word_embeddings", [c.vocab_size, c.embedding_size],
            initializer=self.make.initializer())
        self.position_embeddings = None
        if self.absolute_positions:
            self.position_embeddings = self.add_weight(
                "position_embeddings", [c.max_position_embeddings, c.embedding_size],
                initializer=self.make.initializer(), trainable=not c.frozen_positions)
        self.token_type_embeddings = None
        if c.type_vocab_size:
            self.token_type_embeddings = self.add_weight(
                "token_type_embeddings", [c.type_vocab_size, c.embedding_size],
                initializer=self.make.initializer())
        super().build(input_shape)

    def call(self, features, training=None):
        embedded = self.dropout(self.layer_norm(self.sum(features)), training=training)
        return embedded if self.projection is None else self.projection(embedded)

    def sum(self, features) -> tf.Tensor:
        """The embeddings' sum, before LayerNorm."""
        embedded = tf.gather(self.word_embeddings, features["input_ids"])
        if self.position_embeddings is not None:
            embedded += self._positions(features)
        if self.token_type_embeddings is not None:
            types = features.get("token_type_ids")
            embedded += (self.token_type_embeddings[0] if types is None
                         else tf.gather(self.token_type_embeddings, types))
        return embedded

    def _positions(self, features) -> tf.Tensor:
        ids = features["input_ids"]
        if self.config.encoder_family != "roberta":
            # Positions 0..seq-1 are a slice of the table, broadcast over the batch.
            return self.position_embeddings[:tf.shape(ids)[1]]
        # RoBERTa (fairseq): real tokens count from pad_token_id + 1, padding sits at
        # pad_token_id (transformers' create_position_ids_from_input_ids). A token is padding
        # when it has the pad id, as transformers decides, or is masked out: bertflow's
        # batches pad with id 0 (RoBERTa's <s>), which must not take positions.
        pad = self.config.pad_token_id
        real = tf.not_equal(ids, tf.cast(pad, ids.dtype))
        mask = features.get("attention_mask")
        if mask is not None:
            real &= tf.cast(mask, tf.bool)
        real = tf.cast(real, tf.int32)
        positions = tf.math.cumsum(real, axis=1) * real + pad
        return tf.gather(self.position_embeddings, positions)
