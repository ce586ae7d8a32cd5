"""Training plan (batch sizes, steps, learning rate), optimizer and precision policy."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import tensorflow as tf
import tf_keras

from tasks.errors import ConfigError

# BERT convention: no weight decay on biases and LayerNorm parameters.
NO_DECAY = ["LayerNorm", "layer_norm", "bias"]


@dataclass(frozen=True)
class TrainPlan:
    num_replicas: int
    per_replica_batch_size: int
    grad_accum_steps: int
    global_batch_size: int  # examples per optimizer step
    steps_per_epoch: int
    total_steps: int
    warmup_steps: int
    learning_rate: float  # peak, after lr_scaling
    epochs: int

    @property
    def micro_batch_size(self) -> int:
        """Examples per forward/backward pass over all replicas."""
        return self.per_replica_batch_size * self.num_replicas

    def to_dict(self) -> dict:
        return asdict(self)


def make_plan(cfg, num_train_examples: int, num_replicas: int) -> TrainPlan:
    if num_train_examples < 1:
        raise ConfigError("train_uri", "the training split is empty")
    global_batch = cfg.per_replica_batch_size * num_replicas * cfg.grad_accum_steps
    steps_per_epoch = math.ceil(num_train_examples / global_batch)
    total = steps_per_epoch * cfg.epochs
    if cfg.max_steps:
        total = min(total, cfg.max_steps)
    return TrainPlan(
        num_replicas=num_replicas, per_replica_batch_size=cfg.per_replica_batch_size,
        grad_accum_steps=cfg.grad_accum_steps, global_batch_size=global_batch,
        steps_per_epoch=steps_per_epoch, total_steps=total,
        warmup_steps=int(total * cfg.warmup_ratio),
        learning_rate=scaled_learning_rate(cfg, global_batch),
        epochs=math.ceil(total / steps_per_epoch))


def scaled_learning_rate(cfg, global_batch_size: int) -> float:
    ratio = global_batch_size / cfg.reference_batch_size
    factor = {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[cfg.lr_scaling]
    return cfg.learning_rate * factor


class WarmUpLinearDecay(tf_keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from 0 to `peak` over `warmup_steps`, then linear decay to 0 at
    `total_steps`."""

    def __init__(self, peak: float, warmup_steps: int, total_steps: int):
        self.peak, self.warmup_steps, self.total_steps = peak, warmup_steps, total_steps

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warmup = step / self.warmup_steps if self.warmup_steps else 1.0
        decay = (self.total_steps - step) / max(self.total_steps - self.warmup_steps, 1)
        return self.peak * tf.clip_by_value(tf.minimum(warmup, decay), 0.0, 1.0)

    def get_config(self) -> dict:
        return {"peak": self.peak, "warmup_steps": self.warmup_steps,
                "total_steps": self.total_steps}


class AdamW(tf_keras.optimizers.AdamW):
    """tf-keras AdamW that also trains under CentralStorageStrategy.

    With a LearningRateSchedule, tf-keras keeps the current rate in a variable that
    `apply_gradients` overwrites with `schedule(iterations)` at the start of every step, in
    replica context. Mirrored and multi-worker variables accept that write (each replica
    updates its own copy), but CentralStorage keeps one copy on the host for all replicas (an
    AggregatingVariable), which refuses a replica-context write unless the variable declares
    how the replicas' values combine ("You must specify an aggregation method to update a
    AggregatingVariable in Replica Context"). Every replica computes the same value from the
    same step counter, so taking the first replica's, as tf-keras does for `iterations`, is
    exact. Only this one variable differs from the stock optimizer; its checkpoint name is
    unchanged.
    """

    def _build_learning_rate(self, learning_rate):
        if not isinstance(learning_rate, tf_keras.optimizers.schedules.LearningRateSchedule):
            return super()._build_learning_rate(learning_rate)
        with tf.init_scope():
            current = tf.convert_to_tensor(learning_rate(self.iterations))
            self._current_learning_rate = tf.Variable(
                current, name="current_learning_rate", dtype=current.dtype, trainable=False,
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        return learning_rate


def create_optimizer(cfg, plan: TrainPlan, policy: str) -> tf_keras.optimizers.Optimizer:
    """AdamW on the warm-up/decay schedule (loss-scaled under float16, whose small range
    would flush small gradients to zero). Create it inside strategy.scope()."""
    optimizer = AdamW(
        learning_rate=WarmUpLinearDecay(plan.learning_rate, plan.warmup_steps,
                                        plan.total_steps),
        weight_decay=cfg.weight_decay, epsilon=1e-6)
    optimizer.exclude_from_weight_decay(var_names=NO_DECAY)
    if policy == "mixed_float16":
        return tf_keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer


def precision_policy(cfg, accelerator: str) -> str:
    """The Keras dtype policy: `auto` means float16 on GPU, bfloat16 on TPU, float32 on CPU."""
    if cfg.mixed_precision != "auto":
        return "float32" if cfg.mixed_precision == "none" else cfg.mixed_precision
    return {"gpu": "mixed_float16", "tpu": "mixed_bfloat16"}.get(accelerator, "float32")


def set_precision(cfg, accelerator: str) -> str:
    """Set the global policy before the model is built; returns its name."""
    policy = precision_policy(cfg, accelerator)
    tf_keras.mixed_precision.set_global_policy(policy)
    return policy
