"""Peak host memory of a training worker, estimated from the BERT config and the batch, and
the check that refuses a run that would not fit before any model is built.

Pure Python (no TensorFlow): the validate task and the train step's first lines use it.

The estimate adds what one CPU worker process holds at the peak of a training step:
- weights: float32 variables, 4 bytes per parameter;
- optimizer slots: AdamW's m and v, 8 bytes per parameter;
- gradients: all of them are alive when apply_gradients runs, 4 bytes per parameter;
- accumulators: the custom loop keeps one float32 copy of the trainable variables for gradient
  accumulation (tasks/steps/train.py, make_train_step, creates it whatever grad_accum_steps);
- compute copies: under mixed bfloat16 every weight is cast for the forward pass and the cast
  is kept for the backward pass, and its bfloat16 gradient lives beside the float32 one it is
  cast to: 2 + 2 bytes per parameter (the measured peaks grow by about 20 bytes per
  parameter from bert-base to bert-large, not the 18 the other parts give);
- activations kept for backprop, per layer and example: the (seq x hidden) tensors around
  attention and the layer norms, the (seq x intermediate) tensors around GELU (computed in
  float32, tasks/model/layers.py) and the (heads x seq^2) attention scores,
  probabilities and dropout masks;
- a fixed overhead: the TensorFlow runtime, the tokenizer and input pipeline.
Each of those is multiplied by the replicas the process trains (mirrored on logical CPUs
copies everything per device). The coefficients were fitted to peak RSS measured by
benchmarks/model_sizes.py (bert-base and bert-large, sequence 128 and 512); its results file
records the estimate's error on every measured point (docs/model-sizes.md).
"""
from __future__ import annotations


import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from tasks.errors import ConfigError

GIB = 1 << 30
# Tests (and users who know better) set the budget directly, in bytes.
MEMORY_ENV = "BERTFLOW_WORKER_MEMORY_BYTES"
# Refuse when the estimate exceeds this share of the budget: the estimate's error, stated in
# docs/model-sizes.md, is below the rest.
HEADROOM = 0.9

# Fitted coefficients (see the module docstring): bytes kept for backprop per element, per
# layer and example, under mixed bfloat16 (float32 doubles them: not measured), and the fixed
# overhead. Fitted as an upper bound of the measured peaks (never below one).
ACT_HIDDEN_BYTES = 14.0        # x seq x hidden
ACT_INTERMEDIATE_BYTES = 6.0   # x seq x intermediate
ACT_SCORES_BYTES = 5.75        # x heads x seq^2
FIXED_OVERHEAD_BYTES = 0.76 * GIB


@dataclass(frozen=True)
class BertShape:
    """The sizes of a BERT checkpoint that set its memory (from its config.json)."""
    layers: int
    hidden: int
    heads: int
    intermediate: int
    vocab: int
    max_positions: int = 512
    type_vocab: int = 2

    @classmethod
    def from_config(cls, config: dict) -> "BertShape":
        """BERT, DistilBERT or ELECTRA (tasks/model/config.py reads each family's keys).
        ELECTRA's narrower embeddings are counted at the hidden size: a small overestimate."""
        from tasks.model.config import EncoderConfig

        shape = EncoderConfig.from_dict(config)
        return cls(layers=shape.num_layers, hidden=shape.hidden_size, heads=shape.num_heads,
                   intermediate=shape.intermediate_size, vocab=shape.vocab_size,
                   max_positions=shape.max_position_embeddings,
                   type_vocab=shape.type_vocab_size)

    @classmethod
    def from_file(cls, path: Path) -> "BertShape":
        return cls.from_config(json.loads(Path(path).read_text(encoding="utf-8")))

    def num_parameters(self, num_labels: int = 2) -> int:
        """Parameters of a BertForSequenceClassification with this shape."""
        h, i = self.hidden, self.intermediate
        embeddings = (self.vocab + self.max_positions + self.type_vocab) * h + 2 * h
        layer = 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h
        pooler = h * h + h
        return embeddings + self.layers * layer + pooler + h * num_labels + num_labels


@dataclass(frozen=True)
class Estimate:
    """Bytes by part; `total` is the estimated peak RSS of one worker process."""
    weights: int
    optimizer_slots: int
    gradients: int
    accumulators: int
    compute_copies: int
    activations: int
    overhead: int

    @property
    def total(self) -> int:
        return sum(asdict(self).values())

    def to_dict(self) -> dict:
        return {**asdict(self), "total": self.total}

    def describe(self) -> str:
        parts = ", ".join(f"{name.replace('_', ' ')} {gib(value)}"
                          for name, value in asdict(self).items() if value)
        return f"{gib(self.total)} ({parts})"


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def estimate(shape: BertShape, *, per_replica_batch_size: int, max_seq_length: int,
             grad_accum_steps: int = 1, training_loop: str = "fit", bfloat16: bool = True,
             replicas: int = 1, num_labels: int = 2) -> Estimate:
    """The peak host memory of one CPU training process (see the module docstring)."""
    params = shape.num_parameters(num_labels)
    b, s = per_replica_batch_size, min(max_seq_length, shape.max_positions)
    compute = 1.0 if bfloat16 else 2.0  # compute-dtype bytes relative to bfloat16
    per_layer = (ACT_HIDDEN_BYTES * compute * s * shape.hidden
                 + ACT_INTERMEDIATE_BYTES * compute * s * shape.intermediate
                 + ACT_SCORES_BYTES * compute * shape.heads * s * s)
    activations = b * shape.layers * per_layer
    # The custom loop creates its accumulators whatever grad_accum_steps (make_train_step);
    # the fit loop has no accumulation (parse_config refuses grad_accum_steps > 1 with it).
    accumulate = training_loop == "custom" or grad_accum_steps > 1
    r = max(replicas, 1)
    return Estimate(weights=4 * params * r, optimizer_slots=8 * params * r,
                    gradients=4 * params * r, accumulators=4 * params * r if accumulate else 0,
                    compute_copies=4 * params * r if bfloat16 else 0,
                    activations=int(activations * r), overhead=int(FIXED_OVERHEAD_BYTES))


def largest_batch(shape: BertShape, budget: int, **kwargs) -> int:
    """The largest per_replica_batch_size whose estimate fits `budget` (0 if none does)."""
    fits = lambda b: estimate(shape, per_replica_batch_size=b, **kwargs).total <= budget  # noqa
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


# --- the memory a worker has ---------------------------------------------------------------
# cgroup v2 `memory.max` ("max" = no limit) and cgroup v1 `memory.limit_in_bytes` (a huge
# number = no limit): the limit at which the kernel's OOM killer ends the process (Linux
# Documentation/admin-guide/cgroup-v2.rst and cgroup-v1/memory.rst). A Kubernetes container's
# resources.limits.memory is set as this limit (Kubernetes docs, "Resource Management for Pods
# and Containers").
CGROUP_V2_MAX = Path("/sys/fs/cgroup/memory.max")
CGROUP_V1_LIMIT = Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")
_NO_LIMIT = 1 << 60


def _cgroup_limit(v2: Path = CGROUP_V2_MAX, v1: Path = CGROUP_V1_LIMIT) -> Optional[int]:
    for path in (v2, v1):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < _NO_LIMIT:
            return int(text)
        return None  # "max", or v1's unlimited value
    return None


def machine_memory() -> Optional[tuple[int, int]]:
    """(total, available) bytes of this machine, from psutil (on Linux MemTotal and
    MemAvailable of /proc/meminfo); None where it cannot tell."""
    import psutil  # lazy: only the checks need it

    try:
        vm = psutil.virtual_memory()
    except (OSError, RuntimeError):  # e.g. no /proc mounted
        return None
    return vm.total, vm.available


def _own_rss() -> int:
    import psutil

    try:
        return psutil.Process().memory_info().rss
    except (OSError, psutil.Error):
        return 0


def worker_memory(environ=os.environ, cgroup_v2: Path = CGROUP_V2_MAX,
                  cgroup_v1: Path = CGROUP_V1_LIMIT,
                  machine=machine_memory) -> tuple[Optional[int], str]:
    """(bytes this process may use, where that figure came from); (None, reason) if unknown.

    BERTFLOW_WORKER_MEMORY_BYTES if set; else the cgroup's limit (a pod's limit on
    Kubernetes), capped by MemTotal; else MemAvailable plus what this process holds already.
    `machine`: () -> (total, available) or None, `machine_memory` unless a test gives one.
    """
    if environ.get(MEMORY_ENV):
        try:
            return int(environ[MEMORY_ENV]), MEMORY_ENV
        except ValueError:
            raise ConfigError(MEMORY_ENV, f"{environ[MEMORY_ENV]!r} is not a number of "
                                          f"bytes") from None
    total, available = machine() or (None, None)
    limit = _cgroup_limit(cgroup_v2, cgroup_v1)
    if limit is not None:
        return min(limit, total or limit), "the cgroup memory limit"
    if available is not None:
        return available + _own_rss(), "MemAvailable (the machine's available memory)"
    return None, "the machine's memory is unknown"


def colocated_trainers(tf_config: str) -> int:
    """Training processes of this TF_CONFIG cluster on this task's host (chief and workers:
    the local backend starts them all on 127.0.0.1, a Kubernetes pod holds one)."""
    config = json.loads(tf_config or "{}")
    cluster, task = config.get("cluster") or {}, config.get("task") or {}
    try:
        mine = cluster[task["type"]][int(task.get("index", 0))]
    except (KeyError, IndexError, TypeError, ValueError):
        return 1
    host = mine.rsplit(":", 1)[0]
    return max(1, sum(address.rsplit(":", 1)[0] == host
                      for role in ("chief", "worker") for address in cluster.get(role, [])))


# --- the check ------------------------------------------------------------------------------
def check_fits(cfg, shape: BertShape, budget: int, source: str, *,
               bfloat16: Optional[bool], replicas: int = 1, num_labels: int = 2,
               sharing: int = 1) -> Estimate:
    """Raise ConfigError naming what to lower if the run would not fit `budget` bytes
    (shared by `sharing` training processes); returns the estimate. `bfloat16` None: the
    precision is not known yet (auto on an unknown CPU), so the larger of both estimates."""
    kwargs = dict(max_seq_length=cfg.max_seq_length, grad_accum_steps=cfg.grad_accum_steps,
                  training_loop=cfg.training_loop, replicas=replicas, num_labels=num_labels)
    precisions = (True, False) if bfloat16 is None else (bfloat16,)
    est, kwargs["bfloat16"] = max(
        ((estimate(shape, per_replica_batch_size=cfg.per_replica_batch_size, **kwargs,
                   bfloat16=p), p) for p in precisions), key=lambda pair: pair[0].total)
    usable = int(budget / max(sharing, 1) * HEADROOM)
    if est.total <= usable:
        return est
    where = f"{gib(budget)} ({source})" + (
        f" shared by {sharing} training processes on this machine" if sharing > 1 else "")
    best = largest_batch(shape, usable, **kwargs)
    # Accumulation keeps the global batch with smaller micro-batches, at the price of the
    # custom loop's accumulators.
    micro = largest_batch(shape, usable, **{**kwargs, "training_loop": "custom"})
    if best:
        advice = f"lower per_replica_batch_size to {best} or less"
        if micro:
            accum = -(-cfg.per_replica_batch_size * cfg.grad_accum_steps // micro)
            advice += (f" (to keep the global batch: per_replica_batch_size {micro} with "
                       f"training_loop custom and grad_accum_steps {accum})")
    else:
        advice = "even per_replica_batch_size 1 does not fit: lower max_seq_length"
    raise ConfigError("per_replica_batch_size", (
        f"training would need about {est.describe()} per worker, more than "
        f"{HEADROOM:.0%} of the {where}. To fit, {advice}; or lower max_seq_length "
        f"({cfg.max_seq_length}), or give each worker more memory (worker_memory, a larger "
        f"machine_type) or spread the batch over more workers (num_workers)"))


def check_worker(cfg, config_json: Path, *, device_kind: str, policy: str, replicas: int,
                 num_labels: int, environ=os.environ) -> Optional[Estimate]:
    """train's check, before the model is built, against the memory this worker has (shared
    with the other training processes of its cluster on the same host)."""
    if device_kind != "cpu":
        return None  # GPU and TPU replicas keep weights and activations in device memory
    budget, source = worker_memory(environ)
    if budget is None:
        return None
    return check_fits(cfg, BertShape.from_file(config_json), budget, source,
                      bfloat16=policy != "float32", replicas=replicas, num_labels=num_labels,
                      sharing=colocated_trainers(environ.get("TF_CONFIG", "")))


def readable_config(cfg) -> Optional[Path]:
    """The base checkpoint's config.json when it can be read here without fetching anything
    (the offline default or a local folder); None otherwise (train checks on the worker)."""
    from tasks.io import storage
    from tasks.training import checkpoint_sources

    if not cfg.base_model:
        path = checkpoint_sources.default_base_model_dir() / "config.json"
    elif "://" not in cfg.base_model and storage.is_local(cfg.base_model):
        path = storage.local_path(cfg.base_model) / "config.json"
    else:
        return None
    return path if path.is_file() else None
