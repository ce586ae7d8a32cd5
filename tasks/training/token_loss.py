"""Token classification loss: softmax cross-entropy over the labelled word pieces, the mean
taken over the labelled pieces of the GLOBAL batch, as transformers'
`CrossEntropyLoss(ignore_index=-100)` takes it over one batch.

Why not a per-example mean: sentences hold different numbers of labelled pieces, so averaging
per sentence (or per replica) weighs a short sentence's pieces more than a long one's. Under
tf.distribute each replica sees part of the batch and its gradients are SUMMED across
replicas; dividing each replica's SUM of piece losses by the global count of labelled pieces
makes that sum of gradients the gradient of the global mean, exactly. The custom loop
(tasks/steps/train.py, make_train_step) reads a step's micro-batches first, sums
`labelled_pieces` over all of them and over the replicas, and divides each replica's sum of
piece losses by that total: with gradient accumulation the accumulated gradients again add
up to the gradient of one mean. (`global_count` does the same sum from inside a replica.)

Keras' fit path takes each replica batch's mean over its labelled pieces, averaged over the
replicas (tasks/task_kinds.py, _token_keras_loss), as torch's DistributedDataParallel does.

`loss_normalizer: dataset` replaces both divisors by a fixed count (`pieces_per_row` x
rows): with batches grouped by length a step's own count varies with the sentences' length,
and dividing by it gives a piece of a short-sentence batch more weight than one of a long.
"""
from __future__ import annotations

import tensorflow as tf

from tasks.task_kinds import IGNORED, masked_token_losses


def token_loss_sums(labels: tf.Tensor, logits: tf.Tensor, label_smoothing: float = 0.0,
                    class_weights: tuple[float, ...] | None = None
                    ) -> tuple[tf.Tensor, tf.Tensor]:
    """(loss summed over each example's labelled pieces, float32 [batch]; its labelled
    pieces, float32 [batch]): tasks.task_kinds.masked_token_losses, which Keras' fit path
    uses too."""
    return masked_token_losses(labels, logits, label_smoothing, class_weights)


def pieces_per_row(cfg, train_split: dict) -> float | None:
    """loss_normalizer dataset: the training split's labelled words per row (the data
    manifest's label_counts count one per labelled word), the fixed count a step's loss is
    divided by per row. Any constant keeps every piece's weight equal across batches; this
    one keeps the loss on the batch normalizer's scale. None for batch."""
    if cfg.loss_normalizer != "dataset":
        return None
    rows = train_split["num_examples"]
    return max(sum(train_split["label_counts"].values()) / max(rows, 1), 1.0)


def global_count(local: tf.Tensor) -> tf.Tensor:
    """`local` (a count) summed over the replicas in sync, as the int64 scalar
    `tf.nn.compute_average_loss` takes: call it inside `strategy.run` (outside any strategy
    it is `local` itself). Reduced in float32, which every all-reduce implementation takes
    and which counts exactly up to 2**24 pieces."""
    total = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, tf.cast(local, tf.float32))
    return tf.cast(tf.round(total), tf.int64)


def labelled_pieces(labels: tf.Tensor) -> tf.Tensor:
    """The labelled pieces of a batch (label not IGNORED), float32 scalar."""
    return tf.reduce_sum(tf.cast(tf.not_equal(labels, IGNORED), tf.float32))
