"""Dropout masks as a function of checkpointed state, so a resumed run draws the masks an
uninterrupted one draws.

Keras' dropout (and TensorFlow's stateful RNG ops behind it) keeps its random state in the
process: a run resumed from step k would restart that state and draw other masks than the
uninterrupted run, so only runs without dropout could resume bit for bit. Here each dropout
layer draws a stateless mask seeded by

    (run seed, layer index) folded with (optimizer step x grad_accum_steps + micro-batch)
    and the replica id

The optimizer step is in every checkpoint; the layer index is the layer's place in the
model's construction order; the replica id is global across workers
(MultiWorkerMirrored numbers worker i's replica i), so N devices of one process and N
one-device workers draw the same masks, and no two replicas share one. Under
ParameterServer all workers are replica 0: with several workers, two steps that start before
either updates the step count draw the same masks over different batches (training is
asynchronous there anyway).

bertflow's dropout layers (tasks/model/layers.py, `Dropout`) take a `DropoutSeeds` through
the model's `seed_dropout` and draw their masks with `tf.nn.experimental.stateless_dropout`,
or with bertflow's CPU dropout kernel, whose mask is a hash of the seed pair it is given
(tasks/model/cpu_kernels/dropout.cc).
"""
from __future__ import annotations

from contextlib import contextmanager

import tensorflow as tf

# The micro-batch of an optimizer step being traced (the custom loop's gradient accumulation
# sets it around each forward pass; fit has one micro-batch per step). A plain module global,
# not a thread-local: MirroredStrategy traces its replicas in threads of their own.
_micro_batch: tf.Tensor | int = 0


@contextmanager
def micro_batch(index):
    """Forward passes traced inside draw the masks of micro-batch `index` of the step."""
    global _micro_batch
    previous, _micro_batch = _micro_batch, index
    try:
        yield
    finally:
        _micro_batch = previous


class DropoutSeeds:
    """Seed pairs for a model's dropout layers from the run seed and `step` (the optimizer's
    `iterations` variable, restored with the checkpoint)."""

    def __init__(self, run_seed: int, step: tf.Variable, micro_batches: int = 1):
        self.run_seed, self.step, self.micro_batches = int(run_seed), step, int(micro_batches)

    def seed(self, layer_index: int) -> tf.Tensor:
        """int64 [2] for the layer's forward pass at the current step, micro-batch and
        replica."""
        context = tf.distribute.get_replica_context()
        replica = context.replica_id_in_sync_group if context is not None else 0
        draw = (tf.cast(tf.convert_to_tensor(self.step), tf.int64) * self.micro_batches
                + tf.cast(_micro_batch, tf.int64))
        seed = tf.constant([self.run_seed, layer_index], tf.int64)
        seed = tf.random.experimental.stateless_fold_in(seed, draw)
        return tf.random.experimental.stateless_fold_in(seed, tf.cast(replica, tf.int64))
