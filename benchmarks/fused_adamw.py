"""The optimizer proposed for tasks/model.py (owned by the training engineer), kept here so the
benchmarks can measure it on bertflow's real train path before it is adopted.

tf_keras.optimizers.AdamW updates every variable with a chain of small element-wise ops, and
turns the word-embedding gradient (IndexedSlices) into dense ops anyway: ~150 ms per step for
MiniLM's 22.7M parameters on this 2-core CPU. The legacy Keras Adam runs one fused
ResourceApplyAdam kernel per variable; transformers' AdamWeightDecay adds decoupled weight
decay to it (same rule as AdamW: var -= lr * wd * var, skipped for NO_DECAY names). Summing the
sparse embedding gradient into a dense tensor first keeps every variable on the fused kernel
(the dense update is also what torch.optim.AdamW does). Measured ~45-60 ms per step.
"""
from __future__ import annotations

import tensorflow as tf
from transformers.optimization_tf import AdamWeightDecay


class FusedAdamW(AdamWeightDecay):
    """Decoupled-weight-decay Adam on TensorFlow's fused kernels."""

    def _resource_apply_sparse_duplicate_indices(self, grad, var, indices, **kwargs):
        dense = tf.math.unsorted_segment_sum(grad, indices, tf.shape(var)[0])
        return self._resource_apply_dense(dense, var, **kwargs)

    @property
    def learning_rate(self):
        """The current rate as a tensor (the legacy optimizer would return the schedule),
        so callers' `optimizer.learning_rate.numpy()` keeps working."""
        lr = self._get_hyper("learning_rate")
        return tf.convert_to_tensor(lr(self.iterations)) if callable(lr) else lr


def create_optimizer(cfg, plan, policy):
    """Drop-in for tasks.model.create_optimizer."""
    import tf_keras
    from tasks import model as model_lib
    optimizer = FusedAdamW(
        learning_rate=model_lib.WarmUpLinearDecay(plan.learning_rate, plan.warmup_steps,
                                                  plan.total_steps),
        weight_decay_rate=cfg.weight_decay, epsilon=1e-6,
        exclude_from_weight_decay=model_lib.NO_DECAY)
    if policy == "mixed_float16":
        return tf_keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer
