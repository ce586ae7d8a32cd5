"""tasks/training/token_loss.py: the mean over the labelled pieces of a global batch, as
transformers' CrossEntropyLoss(ignore_index=-100) over one batch (computed here in numpy),
whether the batch is whole, split over replicas or over accumulated micro-batches; under a
tf.distribute strategy through compute_average_loss; 0 for a batch with no label."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tasks.training.entity_metrics import IGNORED
from tasks.training.token_loss import global_count, token_loss_sums

X = IGNORED
LABELS = np.array([[X, 1, 2, X, X, X],  # [CLS] two words [SEP] padding
                   [X, 0, X, 3, 4, X],  # a word of two pieces
                   [X, 2, 1, 1, 0, X]])
LOGITS = np.random.default_rng(0).normal(0, 2, (3, 6, 5)).astype(np.float32)


def reference_mean(labels, logits) -> float:
    """torch.nn.CrossEntropyLoss(ignore_index=-100)'s value, in numpy."""
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    rows, cols = np.nonzero(labels != X)
    return float(-log_probs[rows, cols, labels[rows, cols]].mean())


def replica_loss(labels, logits, total) -> float:
    sums, _ = token_loss_sums(tf.constant(labels), tf.constant(logits))
    return float(tf.nn.compute_average_loss(sums, global_batch_size=total))


def test_whole_batch_is_the_mean_over_labelled_pieces():
    sums, counts = token_loss_sums(tf.constant(LABELS), tf.constant(LOGITS))
    assert counts.numpy().tolist() == [2, 3, 4]
    total = global_count(tf.reduce_sum(counts))
    assert total.dtype == tf.int64 and int(total) == 9
    np.testing.assert_allclose(replica_loss(LABELS, LOGITS, total),
                               reference_mean(LABELS, LOGITS), rtol=1e-6)


def test_replicas_or_micro_batches_add_up_to_the_global_mean():
    """Each part's loss over the global count; their sum (what summed gradients follow)."""
    parts = [(LABELS[:1], LOGITS[:1]), (LABELS[1:], LOGITS[1:])]
    total = int(np.sum(LABELS != X))
    summed = sum(replica_loss(labels, logits, total) for labels, logits in parts)
    np.testing.assert_allclose(summed, reference_mean(LABELS, LOGITS), rtol=1e-6)


def test_inside_a_strategy_and_with_half_precision_logits():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])

    @tf.function
    def step(labels, logits):
        sums, counts = token_loss_sums(labels, logits)
        return tf.nn.compute_average_loss(
            sums, global_batch_size=global_count(tf.reduce_sum(counts)))

    loss = strategy.run(step, (tf.constant(LABELS), tf.constant(LOGITS, tf.float16)))
    np.testing.assert_allclose(float(strategy.reduce("SUM", loss, axis=None)),
                               reference_mean(LABELS, LOGITS.astype(np.float16)), rtol=1e-3)


def test_a_batch_without_labels_has_loss_zero():
    labels = np.full((2, 4), X)
    sums, counts = token_loss_sums(tf.constant(labels), tf.constant(LOGITS[:2, :4]))
    total = global_count(tf.reduce_sum(counts))
    assert float(tf.nn.compute_average_loss(sums, global_batch_size=total)) == 0.0
