"""DeBERTa-v2/v3's encoder (transformers' DebertaV2Model) from bertflow's layers.

What differs from BERT: no absolute positions (position_biased_input false in v3), the
embeddings zeroed at padding, and disentangled attention: content-to-content scores plus
content-to-position (c2p) and position-to-content (p2c) scores against one table of relative
position embeddings (rel_embeddings, LayerNorm'ed, shared by all layers), indexed by log
buckets of the query-key distance. Every choice follows transformers' modeling_deberta_v2.py,
including its padding: a padded query attends to nothing (its scores are all the lowest
value, so its softmax is uniform), where BERT masks keys only.
"""
from __future__ import annotations

import math

import tensorflow as tf
import tf_keras

from tasks.model.config import EncoderConfig
from tasks.model.layers import Embeddings, LayerFactory, SelfAttention, TransformerBlock


def log_bucket_positions(relative: tf.Tensor, bucket_size: int,
                         max_position: int) -> tf.Tensor:
    """transformers' make_log_bucket_position: distances under bucket_size / 2 kept, longer
    ones on a log scale up to max_position. In float64: PyTorch's float32 logs of a distance
    and of the top give exactly 1 at distance max_position - 1, TensorFlow's (another log
    kernel for a scalar) did not, one bucket off there (the test compares all distances)."""
    mid = bucket_size // 2
    sign = tf.cast(tf.sign(relative), tf.float64)
    near = (relative < mid) & (relative > -mid)
    distance = tf.where(near, tf.constant(mid - 1, relative.dtype), tf.abs(relative))
    log_base = math.log((max_position - 1) / mid)
    logged = tf.math.ceil(tf.math.log(tf.cast(distance, tf.float64) / mid) / log_base
                          * (mid - 1)) + mid
    bucket = tf.where(distance <= mid, tf.cast(relative, tf.float64), logged * sign)
    return tf.cast(bucket, tf.int32)


def relative_positions(length: int | tf.Tensor, bucket_size: int,
                       max_position: int) -> tf.Tensor:
    """[length, length] int32: query position - key position, log-bucketed when both
    settings are positive (transformers' build_relative_position). A static length gives a
    constant, computed once outside the graph: no float64 op in it (TPUs have none)."""
    if isinstance(length, int):
        with tf.init_scope():
            return tf.constant(relative_positions(tf.constant(length), bucket_size,
                                                  max_position).numpy())
    ids = tf.range(length)
    relative = ids[:, tf.newaxis] - ids[tf.newaxis, :]
    if bucket_size > 0 and max_position > 0:
        relative = log_bucket_positions(relative, bucket_size, max_position)
    return relative


def _take(scores: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
    """scores [batch, heads, seq, span] -> [batch, heads, seq, seq]: out[..., i, j] =
    scores[..., i, index[i, j]] (torch.gather on the last axis with index expanded)."""
    shape = tf.concat([tf.shape(scores)[:3], tf.shape(index)[-1:]], axis=0)
    return tf.gather(scores, tf.broadcast_to(index, shape), batch_dims=3)


def _either(own, shared):
    """A position projection: its own (pos_key_proj, pos_query_proj) or, with share_att_key,
    the content one."""
    return shared if own is None else own


class DisentangledSelfAttention(SelfAttention):
    """DisentangledSelfAttention and its output projection (attention.self and
    attention.output.dense). Called with (hidden, (pair mask [batch, 1, seq, seq] bool or
    None, relative embeddings [2 * span, hidden] or None, relative positions [seq, seq]))."""

    def __init__(self, config: EncoderConfig, make: LayerFactory, **kwargs):
        super().__init__(config.hidden_size, config.num_heads, config.attention_dropout, make,
                         **kwargs)
        options = self.options = config.deberta
        self.span = options.attention_span
        self.scale = math.sqrt(self.head_size * options.scale_factor)
        relative = options.relative_attention
        self.pos_dropout = (make.dropout(config.hidden_dropout, "pos_dropout")
                            if relative else None)
        own = relative and not options.share_att_key  # else the content projections
        self.pos_key = (make.dense(config.hidden_size, "pos_key")
                        if own and "c2p" in options.pos_att_type else None)
        self.pos_query = (make.dense(config.hidden_size, "pos_query")
                          if own and "p2c" in options.pos_att_type else None)

    def call(self, hidden, context, training=None):
        mask, rel_embeddings, rel_positions = context
        batch = tf.shape(hidden)[0]
        query = self._split_heads(self.query(hidden), batch)
        key = self._split_heads(self.key(hidden), batch)
        value = self._split_heads(self.value(hidden), batch)
        scores = tf.matmul(query, key / self.scale, transpose_b=True)
        if rel_embeddings is not None:
            rel_embeddings = self.pos_dropout(rel_embeddings, training=training)
            scores += self._position_scores(query, key, rel_embeddings, rel_positions)
        if mask is not None:  # masked_fill, as transformers: not an additive bias
            scores = tf.where(mask, scores, tf.constant(scores.dtype.min, scores.dtype))
        probs = self.probs_dropout(tf.nn.softmax(scores, axis=-1), training=training)
        context = tf.transpose(tf.matmul(probs, value), [0, 2, 1, 3])
        context = tf.reshape(context, [batch, -1, self.num_heads * self.head_size])
        return self.output_dense(context)

    def _position_scores(self, query, key, rel_embeddings, rel_positions):
        """transformers' disentangled_attention_bias: c2p and p2c scores, each / scale."""
        rel_embeddings = rel_embeddings[tf.newaxis]  # [1, 2 * span, hidden]
        kinds = self.options.pos_att_type
        score = 0
        if "c2p" in kinds:
            pos_key = self._split_heads(_either(self.pos_key, self.key)(rel_embeddings), 1)
            c2p = tf.matmul(query, pos_key, transpose_b=True)  # [batch, heads, seq, 2 span]
            index = tf.clip_by_value(rel_positions + self.span, 0, 2 * self.span - 1)
            score += _take(c2p, index) / self.scale
        if "p2c" in kinds:
            pos_query = self._split_heads(_either(self.pos_query, self.query)(rel_embeddings), 1)
            p2c = tf.matmul(key, pos_query, transpose_b=True)  # keys against positions
            index = tf.clip_by_value(-rel_positions + self.span, 0, 2 * self.span - 1)
            score += tf.transpose(_take(p2c, index), [0, 1, 3, 2]) / self.scale
        return score


class DebertaEmbeddings(Embeddings):
    """DebertaV2Embeddings: word (+ absolute position when position_biased_input) (+ token
    type when type_vocab_size > 0), LayerNorm, zeroed where attention_mask is 0, dropout."""

    def __init__(self, config: EncoderConfig, make: LayerFactory, **kwargs):
        super().__init__(config, make, config.deberta.position_biased_input, **kwargs)

    def call(self, features, training=None):
        embedded = self.layer_norm(self.sum(features))
        mask = features.get("attention_mask")
        if mask is not None:
            embedded *= tf.cast(mask, embedded.dtype)[:, :, tf.newaxis]
        return self.dropout(embedded, training=training)


class DebertaEncoder(tf_keras.layers.Layer):
    """DebertaV2Model: features -> (last hidden state, None). Its pooler (ContextPooler)
    belongs to the sequence head, as in transformers' checkpoints (`pooler.dense`)."""

    def __init__(self, config: EncoderConfig, make: LayerFactory, with_pooler: bool = True,
                 **kwargs):
        super().__init__(**kwargs)
        self.config, self.make = config, make
        options = config.deberta
        self.embeddings = DebertaEmbeddings(config, make, name="embeddings")
        # transformers makes the LayerNorm whenever norm_rel_ebd asks for it.
        self.rel_layer_norm = (make.layer_norm(config.layer_norm_eps, "rel_layer_norm")
                               if options.norm_rel_embeddings else None)
        self.blocks = [TransformerBlock(
            config, make, attention=DisentangledSelfAttention(config, make, name="attention"),
            name=f"block_{i}") for i in range(config.num_layers)]
        self.pooler = None

    def build(self, input_shape):
        self.rel_embeddings = None
        if self.config.deberta.relative_attention:
            self.rel_embeddings = self.add_weight(
                "rel_embeddings", [2 * self.config.deberta.attention_span,
                                   self.config.hidden_size],
                initializer=self.make.initializer())
        super().build(input_shape)

    def call(self, features, training=None):
        options = self.config.deberta
        hidden = self.embeddings(features, training=training)
        mask = features.get("attention_mask")
        if mask is not None:  # a pair attends when both ends are tokens
            mask = tf.cast(mask, tf.bool)
            mask = mask[:, tf.newaxis, :, tf.newaxis] & mask[:, tf.newaxis, tf.newaxis, :]
        rel_embeddings = rel_positions = None
        if self.rel_embeddings is not None:
            rel_embeddings = tf.cast(self.rel_embeddings, hidden.dtype)
            if self.rel_layer_norm is not None:
                rel_embeddings = self.rel_layer_norm(rel_embeddings)
            length = hidden.shape[1]  # static when the batches are (TPU)
            rel_positions = relative_positions(length or tf.shape(hidden)[1],
                                               options.position_buckets,
                                               options.max_relative_positions)
        for block in self.blocks:
            hidden = block(hidden, (mask, rel_embeddings, rel_positions), training=training)
        return hidden, None
