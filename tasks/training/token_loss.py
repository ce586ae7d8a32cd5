"""Token classification loss: softmax cross-entropy over the labelled word pieces, the mean
taken over the labelled pieces of the GLOBAL batch, as transformers'
`CrossEntropyLoss(ignore_index=-100)` takes it over one batch.

Why not a per-example mean: sentences hold different numbers of labelled pieces, so averaging
per sentence (or per replica) weighs a short sentence's pieces more than a long one's. Under
tf.distribute each replica sees part of the batch and its gradients are SUMMED across
replicas; dividing each replica's SUM of piece losses by the global count of labelled pieces
makes that sum of gradients the gradient of the global mean, exactly:

    sums, counts = token_loss_sums(labels, logits)          # per example, on each replica
    total = global_count(tf.reduce_sum(counts))             # all-reduced over replicas
    loss = tf.nn.compute_average_loss(sums, global_batch_size=total)
    # (tf.reduce_sum(sums) / total: compute_average_loss divides the per-example values' sum
    # by `global_batch_size`, an integer, here counting pieces, not rows; 0 when it is 0)

With gradient accumulation over k micro-batches, `total` must count the labelled pieces of
all k micro-batches (count them first, e.g. from the labels alone), so that the accumulated
gradients again add up to the gradient of one mean.
"""
from __future__ import annotations

import tensorflow as tf

from tasks.training.entity_metrics import IGNORED


def token_loss_sums(labels: tf.Tensor, logits: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(loss summed over each example's labelled pieces, float32 [batch]; its labelled
    pieces, float32 [batch]). labels: int [batch, seq], IGNORED (-100) where a piece scores
    nothing, padding included; logits: [batch, seq, num_labels], any float dtype."""
    labelled = tf.not_equal(labels, IGNORED)
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.where(labelled, labels, tf.zeros_like(labels)),
        logits=tf.cast(logits, tf.float32))
    weights = tf.cast(labelled, tf.float32)
    return tf.reduce_sum(losses * weights, axis=1), tf.reduce_sum(weights, axis=1)


def global_count(local: tf.Tensor) -> tf.Tensor:
    """`local` (a count) summed over the replicas in sync, as the int64 scalar
    `tf.nn.compute_average_loss` takes: call it inside `strategy.run` (outside any strategy
    it is `local` itself). Reduced in float32, which every all-reduce implementation takes
    and which counts exactly up to 2**24 pieces."""
    total = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, tf.cast(local, tf.float32))
    return tf.cast(tf.round(total), tf.int64)
