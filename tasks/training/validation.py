"""Evaluation on the validation rows during training: the best checkpoint and early stopping.

The train step builds one `Validator` when its run has a validation split. It evaluates at
every multiple of `eval_every_steps`, at every epoch's end with `eval_every_epoch`, and at
the last step, with the evaluate step's exact, distributed metrics (`split_metrics`, traced
once). Every worker runs each evaluation (the counts are summed across all of them) and gets
the same figures, so every worker takes the same decisions. Under parameter_server the
chief evaluates alone, between the fit calls of `_fit_in_chunks`.

The best-so-far state lives in `BestState`, a tf.Module saved in the training checkpoint
beside the model and the optimizer: the best validation `gate_metric`, its step, the
evaluations since the last improvement and, with `best_checkpoint`, a copy of the best
weights. A checkpoint is always written after the evaluation of its step, so a preempted
run resumes with exactly the state an uninterrupted one had at that step.

Improvement (as Keras' EarlyStopping): a value above the best by more than
`early_stopping_min_delta`. A run stops after `early_stopping_patience` evaluations in a row
without one.
"""
from __future__ import annotations

import math
import time

import tensorflow as tf

from tasks.config import RunConfig
from tasks.training.summaries import SCALAR


class BestState(tf.Module):
    """The best-so-far state, checkpointed with the model: `value` (-inf before the first
    evaluation), `step` (-1), `stale` (evaluations since the last improvement), `last` (the
    latest evaluation's value) and, when
    `keep_weights`, `weights`: one variable per model weight, placed like it (created in
    the strategy's scope)."""

    def __init__(self, model, strategy, keep_weights: bool):
        super().__init__(name="validation_best")
        self.value = tf.Variable(-math.inf, dtype=tf.float64, trainable=False)
        self.step = tf.Variable(-1, dtype=tf.int64, trainable=False)
        self.stale = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.last = tf.Variable(math.nan, dtype=tf.float64, trainable=False)  # latest value
        self.weights = []
        if keep_weights:
            with strategy.scope():
                self.weights = [tf.Variable(w, trainable=False, name=f"best_{i}")
                                for i, w in enumerate(model.weights)]

    def keep(self, model) -> None:
        for best, weight in zip(self.weights, model.weights):
            best.assign(weight)

    def restore_into(self, model) -> None:
        for best, weight in zip(self.weights, model.weights):
            weight.assign(best)


class Validator:
    """Evaluates at the planned steps and keeps the best-so-far state (see the module)."""

    def __init__(self, cfg: RunConfig, metrics_fn, model, best: BestState, total_steps: int,
                 steps_per_epoch: int, writer=None, history=None):
        self.metric = cfg.gate_metric_name
        self.every = cfg.eval_every_steps
        self.epoch = steps_per_epoch if cfg.eval_every_epoch else 0
        self.patience, self.min_delta = cfg.early_stopping_patience, cfg.early_stopping_min_delta
        self.metrics_fn, self.model, self.best = metrics_fn, model, best
        self.total_steps, self.steps_per_epoch = total_steps, steps_per_epoch
        self.writer, self.history = writer, history  # TensorBoard, history.json (chief)
        self.seconds: list[float] = []  # this attempt's evaluations
        # A sweep's pruning (tasks/runs/pruning.py): a function of (step, value) returning
        # the reason to stop, the same on every worker; `pruned` holds that reason.
        self.prune = None
        self.pruned: str | None = None

    @property
    def stopped(self) -> bool:
        """Pruned, or early stopping's verdict (read from the checkpointed state, so a run
        resumed after it stopped stops again at once)."""
        return self.pruned is not None or (
            bool(self.patience) and int(self.best.stale.numpy()) >= self.patience)

    def due(self, step: int) -> bool:
        return bool((self.every and step % self.every == 0)
                    or (self.epoch and step % self.epoch == 0) or step >= self.total_steps)

    def next_due(self, step: int) -> int:
        """The first evaluation step after `step`."""
        candidates = [self.total_steps]
        for every in (self.every, self.epoch):
            if every:
                candidates.append((step // every + 1) * every)
        return min(candidates)

    def pending(self, step: int) -> bool:
        """Whether step_done(step) evaluates."""
        return self.due(step) and not self.stopped

    def step_done(self, step: int) -> None:
        """Evaluate if `step` is an evaluation step, and update the best state."""
        if not self.pending(step):
            return
        started = time.perf_counter()
        metrics = self.metrics_fn()
        seconds = time.perf_counter() - started
        self.seconds.append(seconds)
        value = float(metrics[self.metric])
        self.best.last.assign(value)
        if value > float(self.best.value.numpy()) + self.min_delta:
            self.best.value.assign(value)
            self.best.step.assign(step)
            self.best.stale.assign(0)
            self.best.keep(self.model)
        else:
            self.best.stale.assign_add(1)
        if self.prune is not None and step < self.total_steps and not self.stopped:
            self.pruned = self.prune(step, value)
        print(f"validation at step {step}: {self.metric} {value:.4f} (best "
              f"{float(self.best.value.numpy()):.4f} at step {int(self.best.step.numpy())}"
              f"{'; early stop' if self.stopped else ''}; {seconds:.2f} s)", flush=True)
        if self.pruned:
            print(f"validation: {self.pruned}", flush=True)
        self._record(step, metrics, seconds)

    def finish(self) -> dict:
        """At the end of training: load the best weights into the model (best_checkpoint)
        and return the train manifest's `validation` entry."""
        if self.best.weights and int(self.best.step.numpy()) >= 0:
            self.best.restore_into(self.model)
        return self.summary()

    def _record(self, step: int, metrics: dict, seconds: float) -> None:
        scalars = {k: float(v) for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)
                   and k != "num_examples"}
        if self.writer is not None:
            with self.writer.as_default(step=step):
                for tag, value in scalars.items():
                    tf.summary.write(tag, tf.constant(value, tf.float32), metadata=SCALAR)
            self.writer.flush()
        if self.history is not None:
            self.history.validation_done({
                "step": step, "epoch": round(step / self.steps_per_epoch, 3), **scalars,
                "seconds": round(seconds, 3)}, self.summary())

    def summary(self) -> dict:
        """The train manifest's `validation` entry (history.json's `best`)."""
        ordered = sorted(self.seconds)
        best_value, last = float(self.best.value.numpy()), float(self.best.last.numpy())
        exported = "best" if self.best.weights else "last"
        return {"metric": self.metric, "best_step": int(self.best.step.numpy()),
                "best_value": best_value,
                "stopped_early": self.stopped,
                "pruned": self.pruned,
                "exported": exported,
                # the validation figure of the weights the run saves (a sweep ranks by it)
                "exported_value": best_value if exported == "best" else last,
                "evaluations_this_attempt": len(ordered),
                "median_seconds": round(ordered[len(ordered) // 2], 3) if ordered else None}


def build(cfg: RunConfig, strategy, name: str, model, metrics_for, total_steps: int,
          steps_per_epoch: int, writer=None, history=None) -> Validator:
    """The run's Validator; `metrics_for(strategy, name)` returns the function of no
    arguments that evaluates the model on the validation rows under that strategy (the
    evaluate step's `split_metrics`). Its BestState is `validator.best`, to be tracked by
    the training checkpoint before it is restored."""
    best = BestState(model, strategy, cfg.keeps_best_checkpoint)
    # parameter_server: inline on the coordinator (the chief), which reads the weights from
    # the parameter servers, as its evaluate step does: the ClusterCoordinator would not count
    # each row exactly once (tasks/steps/evaluate.py).
    if name == "parameter_server":
        strategy, name = tf.distribute.OneDeviceStrategy("/cpu:0"), "one_device"
    return Validator(cfg, metrics_for(strategy, name), model, best, total_steps,
                     steps_per_epoch, writer, history)
