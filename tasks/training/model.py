"""Training plan (batch sizes, steps, learning rate), optimizer and precision policy."""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

import tensorflow as tf
import tf_keras

from tasks.model import cpu_kernels
from tasks.errors import ConfigError

# BERT convention: no weight decay on biases and LayerNorm parameters.
NO_DECAY = ["LayerNorm", "layer_norm", "bias"]
# torch.optim.AdamW's and transformers' Trainer's default, added to the bias-corrected sqrt(v).
TORCH_EPSILON = 1e-8


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
    lr_schedule: str = "linear"  # WarmUpSchedule's shape after the warm-up
    lr_power: float = 1.0  # polynomial's
    label_smoothing: float = 0.0
    class_weights: tuple[float, ...] | None = None  # per label (class_weights.py); None: 1
    # loss_normalizer dataset: the training split's labelled words per row (a step's
    # divisor is this x its rows); None: each step's own labelled pieces.
    pieces_per_row: float | None = None

    @property
    def micro_batch_size(self) -> int:
        """Examples per forward/backward pass over all replicas."""
        return self.per_replica_batch_size * self.num_replicas

    def to_dict(self) -> dict:
        return asdict(self)


def make_plan(cfg, num_train_examples: int, num_replicas: int,
              class_weights: tuple[float, ...] | None = None,
              pieces_per_row: float | None = None) -> TrainPlan:
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
        # constant (transformers' get_constant_schedule) has no warm-up.
        warmup_steps=0 if cfg.lr_schedule == "constant" else int(total * cfg.warmup_ratio),
        learning_rate=scaled_learning_rate(cfg, global_batch),
        epochs=math.ceil(total / steps_per_epoch), lr_schedule=cfg.lr_schedule,
        lr_power=cfg.lr_power, label_smoothing=cfg.label_smoothing,
        class_weights=class_weights, pieces_per_row=pieces_per_row)


def scaled_learning_rate(cfg, global_batch_size: int) -> float:
    ratio = global_batch_size / cfg.reference_batch_size
    factor = {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[cfg.lr_scaling]
    return cfg.learning_rate * factor


class WarmUpSchedule(tf_keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from 0 to `peak` over `warmup_steps`, then, to `total_steps`, the shape
    of transformers' get_scheduler of that name (optimization.py):
    - linear: peak x (total - step) / (total - warmup), to 0;
    - cosine: peak x 0.5 (1 + cos(pi x progress)), half a cycle, to 0;
    - polynomial: peak x (1 - progress) ** power, to 0 (transformers ends at lr_end 1e-7);
    - constant, constant_with_warmup: peak (make_plan gives constant no warm-up).
    A function of the step alone: a resumed run continues on the same curve."""

    def __init__(self, peak: float, warmup_steps: int, total_steps: int,
                 shape: str = "linear", power: float = 1.0):
        self.peak, self.warmup_steps, self.total_steps = peak, warmup_steps, total_steps
        self.shape, self.power = shape, power

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warmup = step / self.warmup_steps if self.warmup_steps else 1.0
        # 1 at the warm-up's end, 0 at total_steps (above 1 during the warm-up)
        left = (self.total_steps - step) / max(self.total_steps - self.warmup_steps, 1)
        if self.shape == "linear":
            decay = left
        elif self.shape == "cosine":
            decay = 0.5 * (1.0 + tf.cos(math.pi * (1.0 - tf.clip_by_value(left, 0.0, 1.0))))
        elif self.shape == "polynomial":
            decay = tf.clip_by_value(left, 0.0, 1.0) ** self.power
        else:  # constant, constant_with_warmup
            decay = tf.ones_like(step)
        return self.peak * tf.clip_by_value(tf.minimum(warmup, decay), 0.0, 1.0)

    def get_config(self) -> dict:
        return {"peak": self.peak, "warmup_steps": self.warmup_steps,
                "total_steps": self.total_steps, "shape": self.shape, "power": self.power}


class AdamW(tf_keras.optimizers.legacy.Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter; torch.optim.AdamW's rule), built
    on TensorFlow's fused kernels.

    tf_keras.optimizers.AdamW updates each variable with a chain of small element-wise ops,
    a large share of a MiniLM step on a 2-core CPU (profiled by hand; no results file). Here
    each variable takes two fused kernels: the decay
    `var -= lr * weight_decay * var` (ResourceApplyGradientDescent with the variable as its own
    gradient) and then one ResourceApplyAdam.
    The word-embedding gradient arrives as IndexedSlices; it is summed into a dense tensor so
    that it takes the same kernels and every row gets the dense AdamW update torch applies.
    Being a legacy-Keras optimizer, it keeps its learning rate as a schedule evaluated at
    `iterations`, with no variable written in replica context, so it also trains under
    CentralStorage and ParameterServer strategies.

    With `cpu_kernel`, each variable takes one pass instead (tasks/model/cpu_kernels/adamw.cc): the
    same rule, and the sparse embedding gradient is applied without building a dense tensor.
    The kernel also applies `global_clipnorm`: the factor tf.clip_by_global_norm would multiply
    every gradient by is computed once per step (clip_factor) and each gradient is scaled as
    the kernel reads it, which saves a pass that writes a scaled copy of every gradient.

    `epsilon` is torch's: added to the bias-corrected sqrt(v_hat). Both kernels add theirs to
    the uncorrected sqrt(v) (Keras' Adam passes its epsilon so), so they are given
    epsilon * sqrt(1 - beta_2^t), which is the same step:
        lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^t)) + eps)
        = lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps * sqrt(1 - b2^t)).
    Keras' rule with the 1e-6 bertflow used before is torch's epsilon 1e-6 / sqrt(1 - b2^t):
    3,000x torch's 1e-8 at the first step, still 130x after 850 steps, damping the steps of
    weights whose gradients are small.
    """

    def __init__(self, learning_rate, weight_decay: float, exclude_from_weight_decay=(),
                 cpu_kernel: bool = False, lr_multiplier=None, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.weight_decay = weight_decay
        # variable name -> factor on the scheduled rate (layer_lr_decay, head_learning_rate)
        self.lr_multiplier = lr_multiplier
        self._no_decay = [re.compile(pattern) for pattern in exclude_from_weight_decay]
        self.cpu_kernel = cpu_kernel
        self._clip_factor = None  # this step's, between _transform_gradients and the updates

    def decays(self, var) -> bool:
        return bool(self.weight_decay) and not any(p.search(var.name) for p in self._no_decay)

    def _coefficients(self, var, apply_state):
        key = (var.device, var.dtype.base_dtype)
        return (apply_state or {}).get(key) or self._fallback_apply_state(*key)

    def _scaled(self, var, apply_state):
        """apply_state with `var`'s learning-rate factor applied to the step size and the
        decay (torch's per-parameter-group lr), or apply_state itself when it is 1."""
        factor = self.lr_multiplier(var.name) if self.lr_multiplier else 1.0
        if factor == 1.0:
            return apply_state
        c = dict(self._coefficients(var, apply_state))
        c["lr_t"], c["lr"] = c["lr_t"] * factor, c["lr"] * factor
        if self.cpu_kernel:  # [lr, 1 - b1^t, 1 - b2^t, epsilon, lr_t x weight decay]
            scale = tf.constant([factor, 1.0, 1.0, 1.0, factor], c["kernel_decay"].dtype)
            c["kernel_decay"] = c["kernel_decay"] * scale
            c["kernel_no_decay"] = c["kernel_no_decay"] * scale
        return {(var.device, var.dtype.base_dtype): c}

    def _prepare_local(self, var_device, var_dtype, apply_state):
        super()._prepare_local(var_device, var_dtype, apply_state)
        # Keras: "lr_t" is the scheduled rate (torch's lr), "lr" the bias-corrected step size.
        state = apply_state[(var_device, var_dtype)]
        state["epsilon"] = state["epsilon"] * tf.sqrt(1 - state["beta_2_power"])
        if self.cpu_kernel:  # the kernel's coefficients, stacked once per step, not per variable
            rates = [state["lr"], state["one_minus_beta_1_t"], state["one_minus_beta_2_t"],
                     state["epsilon"]]
            state["kernel_decay"] = tf.stack(rates + [state["lr_t"] * self.weight_decay])
            state["kernel_no_decay"] = tf.stack(rates + [tf.zeros([], var_dtype)])
            state["kernel_unscaled"] = tf.ones([], var_dtype)

    def apply_gradients(self, grads_and_vars, name=None, experimental_aggregate_gradients=True):
        try:
            return super().apply_gradients(grads_and_vars, name, experimental_aggregate_gradients)
        finally:
            self._clip_factor = None  # a later trace must not find this one's tensor

    def _transform_gradients(self, grads_and_vars):
        """After the replicas' gradients are summed. With the kernel, global-norm clipping is
        left to it: the factor is kept for the updates that follow in this apply_gradients.
        Under MirroredStrategy each replica computes it from the same summed gradients, and
        the updates, built once for all replicas, take the last one."""
        if not (self.cpu_kernel and self.global_clipnorm):
            return super()._transform_gradients(grads_and_vars)
        if self.clipvalue is not None or self.clipnorm is not None or self.gradient_transformers:
            raise ValueError("AdamW(cpu_kernel=True) clips by global norm only")
        grads_and_vars = list(grads_and_vars)
        self._clip_factor = clip_factor([g for g, _ in grads_and_vars], self.global_clipnorm)
        return grads_and_vars

    def _apply_kernel(self, grad, var, apply_state, indices=None):
        c = self._coefficients(var, apply_state)
        coefficients = c["kernel_decay" if self.decays(var) else "kernel_no_decay"]
        if self.global_clipnorm:
            if self._clip_factor is None:
                raise RuntimeError("AdamW: a kernel update outside apply_gradients would skip "
                                   "the clipping")
            scale = self._clip_factor
        else:
            scale = c["kernel_unscaled"]
        return cpu_kernels.apply_adamw(var, self.get_slot(var, "m"), self.get_slot(var, "v"),
                                       grad, coefficients, scale, indices)

    def _resource_apply_dense(self, grad, var, apply_state=None):
        apply_state = self._scaled(var, apply_state)
        if self.cpu_kernel:
            return self._apply_kernel(grad, var, apply_state)
        if not self.decays(var):
            return super()._resource_apply_dense(grad, var, apply_state)
        coefficients = self._coefficients(var, apply_state)
        decay = tf.raw_ops.ResourceApplyGradientDescent(
            var=var.handle, alpha=coefficients["lr_t"] * self.weight_decay,
            delta=var.read_value(), use_locking=self._use_locking)
        with tf.control_dependencies([decay]):
            return super()._resource_apply_dense(grad, var, apply_state)

    def _resource_apply_sparse_duplicate_indices(self, grad, var, indices, **kwargs):
        if self.cpu_kernel:
            return self._apply_kernel(grad, var, self._scaled(var, kwargs.get("apply_state")),
                                      indices)
        dense = tf.math.unsorted_segment_sum(grad, indices, tf.shape(var)[0])
        return self._resource_apply_dense(dense, var, **kwargs)

    def get_config(self) -> dict:
        return {**super().get_config(), "weight_decay": self.weight_decay,
                "exclude_from_weight_decay": [p.pattern for p in self._no_decay]}


def clip_factor(grads, clip_norm: float) -> tf.Tensor:
    """What tf.clip_by_global_norm multiplies each gradient by (the same ops): 1 while the
    global norm is at most `clip_norm`, clip_norm / norm above it, NaN if the norm is not
    finite. IndexedSlices count their values, repeated rows separately, as it counts them."""
    norm = tf.linalg.global_norm(grads)
    clip = tf.constant(clip_norm, norm.dtype)
    return clip * tf.minimum(1.0 / norm, tf.constant(1.0, norm.dtype) / clip) + (norm - norm)


def lr_multiplier(cfg, num_layers: int):
    """variable name -> its factor on the scheduled rate, or None when every factor is 1.
    layer_lr_decay d: the transformer layer k from the top (k = 0 for the last) takes d**k,
    the embeddings d**num_layers (ELECTRA's fine-tuning recipe, counted as the issue asks);
    the head takes head_learning_rate / learning_rate (so lr_scaling scales both), the
    pooler the top layer's rate."""
    decay, head = cfg.layer_lr_decay, cfg.head_learning_rate
    if decay == 1.0 and head is None:
        return None
    head_factor = head / cfg.learning_rate if head is not None else 1.0

    def factor(name: str) -> float:
        if "/head/" in name:
            return head_factor
        block = _BLOCK.search(name)
        if block:
            return decay ** (num_layers - 1 - int(block.group(1)))
        return decay ** num_layers if "/embeddings/" in name else 1.0
    return factor


_BLOCK = re.compile(r"/block_(\d+)/")


def create_optimizer(cfg, plan: TrainPlan, policy: str, cpu_kernel: bool = False,
                     clip_norm: float = 0.0,
                     num_layers: int = 0) -> tf_keras.optimizers.legacy.Optimizer:
    """AdamW on the plan's warm-up and schedule (loss-scaled under float16, whose small range
    would flush small gradients to zero), clipping the gradient to the global norm
    `clip_norm` (0: not). Keras' legacy optimizer clips in apply_gradients after summing the
    replicas' gradients, so every replica clips the same global gradient (under
    ParameterServer, each worker's own). Create it inside strategy.scope()."""
    optimizer = AdamW(
        learning_rate=WarmUpSchedule(plan.learning_rate, plan.warmup_steps,
                                     plan.total_steps, plan.lr_schedule, plan.lr_power),
        weight_decay=cfg.weight_decay, exclude_from_weight_decay=NO_DECAY,
        epsilon=TORCH_EPSILON, cpu_kernel=cpu_kernel,
        lr_multiplier=lr_multiplier(cfg, num_layers),
        global_clipnorm=clip_norm or None)
    if policy == "mixed_float16":
        return tf_keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer


def create_slots(optimizer, variables) -> None:
    """Create the optimizer's step counter, hyperparameters and slots (m, v) for `variables`
    now, inside strategy.scope(), rather than in the first traced step. tf.function traces a
    function that creates variables twice (once creating them, once without), and Keras'
    first apply_gradients creates them: a second trace and graph optimization of the whole
    training step. A checkpoint restored afterwards assigns them."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # under a LossScaleOptimizer
    with tf.name_scope(inner._name), tf.init_scope():  # as legacy apply_gradients does first
        inner._create_all_weights(variables)


def current_learning_rate(optimizer) -> float:
    """The rate the optimizer's next step uses (its schedule at `iterations`)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # under a LossScaleOptimizer
    return float(inner._decayed_lr(tf.float32).numpy())


def precision_policy(cfg, accelerator: str) -> str:
    """The Keras dtype policy. `auto` means float16 on GPU, bfloat16 on TPU, and on CPU
    bfloat16 where the cores multiply bfloat16 natively, else float32."""
    if cfg.mixed_precision != "auto":
        return "float32" if cfg.mixed_precision == "none" else cfg.mixed_precision
    if accelerator == "cpu":
        return "mixed_bfloat16" if cpu_has_native_bf16() else "float32"
    return {"gpu": "mixed_float16", "tpu": "mixed_bfloat16"}.get(accelerator, "float32")


# x86 flags for bfloat16 dot products (AVX512-BF16) and tile multiplies (AMX); oneDNN uses them
# for bfloat16 matmuls. Without them it emulates bfloat16 and mixed precision is slower.
BF16_CPU_FLAGS = {"avx512_bf16", "amx_bf16"}


def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return not BF16_CPU_FLAGS.isdisjoint(line.split(":", 1)[1].split())
    except OSError:
        pass  # not Linux: stay with float32
    return False


def set_precision(cfg, accelerator: str) -> str:
    """Set the global policy before the model is built; returns its name."""
    policy = precision_policy(cfg, accelerator)
    tf_keras.mixed_precision.set_global_policy(policy)
    return policy
