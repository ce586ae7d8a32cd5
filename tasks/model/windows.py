"""Sliding windows over long texts (`long_text: window`), in-graph: one rule for the tokenize
step, which writes each window as a record, and the SavedModel, which windows raw strings
before the encoder and aggregates the windows' logits per text.

A text of n word pieces, with a budget of b = max_seq_length - 2 pieces per window and an
overlap of s pieces (`window_stride`), gets windows starting at 0, b - s, 2 (b - s), ...:
one window when n <= b (the text as truncation would keep it, whole), else
1 + ceil((n - b) / (b - s)), the last ending at the text's last piece. This is what Hugging
Face tokenizers return with `return_overflowing_tokens=True, stride=s`. Each window gets
[CLS] and [SEP] of its own.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

AGGREGATIONS = ("mean", "max")


def window_counts(lengths: tf.Tensor, budget: int, stride: int) -> tf.Tensor:
    """Windows per text of `lengths` pieces (int64 [texts]); an empty text has one."""
    step = budget - stride
    if step <= 0:
        raise ValueError(f"window overlap {stride} must be below the window's {budget} pieces")
    lengths = tf.cast(lengths, tf.int64)
    extra = tf.maximum(lengths - budget, 0)
    return 1 + (extra + step - 1) // step


def _layout(lengths: tf.Tensor, budget: int, stride: int):
    """(text index, first piece, pieces) of every window of texts of `lengths` pieces."""
    lengths = tf.cast(lengths, tf.int64)
    counts = window_counts(lengths, budget, stride)
    text = tf.repeat(tf.range(tf.size(counts, out_type=tf.int64)), counts)
    k = tf.ragged.range(counts).flat_values  # a window's place within its text
    start = k * (budget - stride)
    return text, start, tf.minimum(tf.cast(budget, tf.int64), tf.gather(lengths, text) - start)


def window_pieces(pieces: tf.RaggedTensor, budget: int, stride: int
                  ) -> tuple[tf.RaggedTensor, tf.Tensor]:
    """(windows [windows, (pieces)], text index of each window int64 [windows]) of the
    texts' word pieces `pieces` [texts, (pieces)]: windows in text order, each text's in
    order of position."""
    text, start, size = _layout(pieces.row_lengths(), budget, stride)
    first = tf.gather(pieces.row_starts(), text) + start
    positions = tf.ragged.range(first, first + size).flat_values
    windows = tf.RaggedTensor.from_row_lengths(tf.gather(pieces.flat_values, positions), size)
    return windows, text


def max_context(lengths: tf.Tensor, budget: int, stride: int
                ) -> tuple[tf.RaggedTensor, tf.Tensor]:
    """Which window speaks for each piece of texts of `lengths` pieces, by the "max context"
    rule of BERT's SQuAD code (_check_is_max_context): the window where the piece has the
    most pieces on its shorter side, min(left, right) + 0.01 * the window's pieces, the
    earlier window on a tie. Returns (bool [windows, (pieces)] laid out as window_pieces'
    windows: this is the piece's window; int64 [all pieces]: the flat index, among all
    windows' pieces, of each piece's own window's copy)."""
    lengths = tf.cast(lengths, tf.int64)
    text, start, size = _layout(lengths, budget, stride)
    offset = tf.ragged.range(size)  # each window piece's place in its window
    left = offset.flat_values
    right = tf.repeat(size, size) - 1 - left
    piece = tf.repeat(tf.gather(tf.math.cumsum(lengths, exclusive=True), text) + start,
                      size) + left  # the piece's index among all the texts' pieces
    score = 100 * tf.minimum(left, right) + tf.repeat(size, size)  # SQuAD's, times 100
    total = tf.reduce_sum(lengths)
    best = tf.math.unsorted_segment_max(score, piece, total)
    copy = tf.range(tf.size(piece, out_type=tf.int64))
    owner = tf.math.unsorted_segment_min(
        tf.where(score == tf.gather(best, piece), copy, copy.dtype.max), piece, total)
    return offset.with_flat_values(tf.equal(tf.gather(owner, piece), copy)), owner


def encode_windows(encoder, texts, stride: int):
    """(input_ids, token_type_ids) int64 RaggedTensors [windows, (tokens)] and the text index
    of each window, of raw strings `texts` through `encoder` (a BertTextEncoder: its word
    pieces, [CLS]/[SEP] ids and max_seq_length), plus each text's length in pieces before
    windowing, with [CLS]/[SEP] (as the encoder's untruncated lengths)."""
    pieces = encoder.wordpieces(texts)
    windows, text = window_pieces(pieces, encoder.max_seq_length - 2, stride)
    ids, types = tf_text.combine_segments([windows], start_of_sequence_id=encoder.cls_id,
                                          end_of_segment_id=encoder.sep_id)
    return ids, tf.cast(types, tf.int64), text, pieces.row_lengths() + 2


def aggregate(logits: tf.Tensor, text: tf.Tensor, num_texts, how: str) -> tf.Tensor:
    """Per-text logits [num_texts, ...] from the windows' `logits` [windows, ...]: the mean or
    the element-wise max over each text's windows (`text`: a window's text index)."""
    if how not in AGGREGATIONS:
        raise ValueError(f"window aggregation {how!r}: use one of {AGGREGATIONS}")
    reduce = tf.math.unsorted_segment_mean if how == "mean" else tf.math.unsorted_segment_max
    return reduce(logits, text, num_texts)


def by_text(text_ids, truth, logits, how: str):
    """(truth [texts, ...], logits [texts, ...]) of windows gathered in any order, from any
    replica (numpy: each window's text id, its text's label, its logits): one row per
    distinct text id, in id order, its logits aggregated over its windows (`aggregate`)."""
    ids, first, index = np.unique(text_ids, return_index=True, return_inverse=True)
    texts = aggregate(tf.constant(logits, tf.float32), tf.constant(index.reshape(-1)),
                      len(ids), how)
    return truth[first], texts.numpy()
