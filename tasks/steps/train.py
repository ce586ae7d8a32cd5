"""Train step: fine-tune the base checkpoint on the tokenized training split.

Runs in a worker process (`python -m tasks train --run-dir URI`), never in Airflow. Every
process of a cluster runs this same code: under multi_worker_mirrored all workers train in
lockstep; under parameter_server the chief trains while workers and ps only serve it. Only the
chief writes to the run folder, the others write to temporary folders that are removed. A
restart resumes from the latest checkpoint. A preemption notice stops every process at one
step boundary, saved, with exit code 75 (tasks/training/preemption.py); each process reports
its goodput parts per attempt (tasks/training/goodput_clock.py). See docs/preemption.md.
After the model is saved, the same processes evaluate it in memory (`evaluate_in_train`),
and the evaluate step publishes those metrics.
"""
from __future__ import annotations

import functools
import shutil
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Iterator

import tensorflow as tf
import tf_keras

from tasks import class_weights, thresholds
from tasks.model.hf_weights import save_hf_checkpoint
from tasks.steps import evaluate, window_data
from tasks.training import (checkpoint, checkpoint_publish, determinism, inputs, memory,
                            preemption, seeded_dropout, token_loss, validation)
from tasks.training import model as model_lib
from tasks.training import strategy as strategy_lib
from tasks.training.summaries import SCALAR
from tasks.training.goodput_clock import (GoodputClock, attempt_number, parts_uri,
                                          previous_high_water, process_started_at)
from tasks.io import storage
from tasks.config import DEFAULT_CLIP_NORM, RunConfig, check_training_loop
from tasks.errors import ConfigError
from tasks.io.uris import join_uri
from tasks.runs import pruning
from tasks.runs.runlayout import RunContext, read_manifest, write_manifest
from tasks.task_kinds import TaskKind, kind as task_kind

KEEP_CHECKPOINTS = 3
EVAL_METRICS = "eval_metrics.json"  # in the train step's folder (evaluate_in_train)


def run(cfg: RunConfig, ctx: RunContext) -> str:
    started_at = process_started_at()
    determinism.configure(cfg)  # before any op (the `deterministic` Param)
    watcher = preemption.Watcher().install()
    role, index = strategy_lib.task_role()
    step_uri = ctx.step_uri("train")
    name = strategy_lib.strategy_name(cfg)
    attempt = attempt_number()
    if strategy_lib.is_server_task(name):
        strategy_lib.serve_forever(stop=preemption.serve_until_preempted(
            watcher, step_uri, role, index, attempt, started_at))
    clock = GoodputClock(parts_uri(step_uri, attempt, role, index), started_at,
                         previous_high_water(step_uri, attempt, role, index))
    try:
        return _train(cfg, ctx, name, watcher, clock, attempt)
    except preemption.Preempted as stopped:
        clock.write()
        preemption.write_record(step_uri, role, index, stopped.step, watcher, time.time())
        print(f"train: preempted; saved at step {stopped.step}, exiting "
              f"{preemption.PREEMPTED_EXIT_CODE}", flush=True)
        preemption.exit_preempted()
    finally:
        watcher.close()


def _train(cfg: RunConfig, ctx: RunContext, name: str, watcher: preemption.Watcher,
           clock: GoodputClock, attempt: int) -> str:
    # The loop/strategy rules parse_config applies, also for configs built without it.
    check_training_loop(cfg, name)
    strategy, name = strategy_lib.build_strategy(cfg)
    watcher.install_signal()  # after the strategy, which may take SIGTERM for itself
    device = strategy_lib.device_kind(cfg, name)
    policy = model_lib.set_precision(cfg, device)
    kernels = strategy_lib.use_cpu_kernels(device, name)
    tok = read_manifest(ctx.manifest_uri("tokenize"))
    labels = tok["labels"]  # the outputs' names (regression: one, the label column)
    kind = task_kind(tok.get("task", "classification"))
    # The data manifest's training counts, read only by the settings that need them.
    needs_counts = cfg.class_weights != "none" or cfg.loss_normalizer != "batch"
    train_split = (read_manifest(ctx.manifest_uri("data"))["splits"]["train"]
                   if needs_counts else {})
    weights = None if cfg.class_weights == "none" else class_weights.for_run(
        cfg.class_weights, kind.name, labels, train_split)
    # An epoch is every record: with long_text window, every window of every text.
    plan = model_lib.make_plan(cfg, window_data.records_of(tok["splits"]["train"]),
                               strategy.num_replicas_in_sync, weights,
                               token_loss.pieces_per_row(cfg, train_split))
    check_validation(cfg, tok, plan, name)
    check_thresholds(cfg, tok)
    resolved = checkpoint.resolve_base_checkpoint(cfg)
    base = resolved.path
    # A run that would not fit this worker's memory stops here, not in the kernel's OOM killer.
    memory.check_worker(cfg, base / "config.json", device_kind=device, policy=policy,
                        replicas=len(getattr(strategy.extended, "worker_devices", None) or [0]),
                        num_labels=len(labels))
    chief = strategy_lib.is_chief()
    step_uri = ctx.step_uri("train")
    if name == "parameter_server":  # the chief alone decides; servers tell it by file
        watcher.watch_notices(step_uri, attempt)
    tf_keras.utils.set_random_seed(cfg.seed)
    print(describe_plan(cfg, plan, name, policy, kernels), flush=True)
    print(f"train: {checkpoint.describe_head(base, labels)}; from {resolved.kind} "
          f"{resolved.location} {resolved.revision} (weights sha256 {resolved.sha256[:12]})",
          flush=True)

    with _output_dir(step_uri, chief) as out, inputs.local_shards(tok, "train") as files, \
            validation_shards(tok) as validation_files:
        with strategy.scope():
            model = checkpoint.load_classifier(base, labels, cpu_kernels=kernels,
                                               head=kind.head)
            frozen = freeze(model, cfg)  # before the slots: frozen weights get none
            optimizer = model_lib.create_optimizer(cfg, plan, policy, cpu_kernel=kernels,
                                                   clip_norm=clip_norm(cfg, name),
                                                   num_layers=model.config.num_layers)
            model_lib.create_slots(optimizer, model.trainable_variables)
            # Masks from (seed, step, layer, replica): a resumed run draws the same ones.
            model.seed_dropout(seeded_dropout.DropoutSeeds(
                cfg.seed, optimizer.iterations, plan.grad_accum_steps))
        tracked = {"model": model, "optimizer": optimizer}
        validator = None
        if validation_files is not None:
            validator = validation.build(
                cfg, strategy, name, model, lambda on, as_name: evaluate.split_metrics(
                    cfg, tok, on, as_name, model, validation_files, "validation"),
                plan.total_steps, plan.steps_per_epoch, writer=tf.summary.create_file_writer(
                    str(out / "tensorboard" / "validation")))
            tracked["validation"] = validator.best  # the best-so-far state resumes too
            validator.prune = pruning_hook(cfg, ctx, strategy, name, chief, validator)
        with strategy.scope():
            manager = tf.train.CheckpointManager(
                tf.train.Checkpoint(**tracked), out / "checkpoints",
                max_to_keep=KEEP_CHECKPOINTS)
            if manager.latest_checkpoint:
                manager.checkpoint.restore(manager.latest_checkpoint)
        start_step = int(optimizer.iterations.numpy())
        if start_step:
            print(f"train: resuming from step {start_step} ({manager.latest_checkpoint})",
                  flush=True)
        progress = Progress(plan, out / "tensorboard", History(
            join_uri(step_uri, "history.json"), plan, start_step) if chief else None,
            clock=clock, metric=kind.train_metric)
        if validator is not None:
            validator.history = progress.history
            progress.paused = lambda: sum(validator.seconds)

        def dataset_fn(input_context, seed_offset=0, skip_batches=0):
            return inputs.train_dataset(files, plan.micro_batch_size, cfg.max_seq_length,
                                        cfg.seed + seed_offset, input_context,
                                        static_shapes=name == "tpu", skip_batches=skip_batches,
                                        num_rows=window_data.records_of(tok["splits"]["train"]),
                                        label_spec=tok.get("label_spec"),
                                        group_by_length=groups_by_length(cfg, kind))

        if start_step < plan.total_steps and not (validator and validator.stopped):
            loop = {"fit": _fit, "custom": _custom_loop}[cfg.training_loop]
            if name == "parameter_server":
                loop = _fit_in_chunks
            loop = functools.partial(loop, kind=kind)
            upload = None
            if chief and not storage.is_local(step_uri):
                # Remote run folders: publish every checkpoint as it is written (its own
                # files, then the index), so a retry after a crash or a preemption finds it.
                upload = functools.partial(checkpoint_publish.publish, manager,
                                           out / "checkpoints",
                                           join_uri(step_uri, "checkpoints"))
            saver = Saver(manager, cfg.checkpoint_every_steps, upload, clock,
                          preemption.Agreement(strategy, name, watcher), validator)
            if name == "parameter_server":  # fit's step loop checks stop_training
                watcher.on_notice = lambda: setattr(model, "stop_training", True)
            clock.loop_started(start_step)
            try:
                loop(strategy, name, model, optimizer, plan, dataset_fn, saver, progress)
            except preemption.Preempted:
                if progress.history is not None:  # the resumed run keeps these records
                    progress.history.write()
                raise
            # No training checkpoint at the end: the model saved below is the run's result,
            # and the weights with both Adam slots cost 3x its bytes to write (and upload)
            # on every run. A retry after the end resumes from the last periodic checkpoint
            # and runs the steps after it again. (The Trainer, with its default
            # save_strategy "steps", does write a full checkpoint at the last step as well.)
        validated = None
        if validator is not None:
            validated = validator.finish()  # best_checkpoint: the best weights from here on
            if progress.history is not None:
                progress.history.best = validated
                progress.history.write()
        tuned = None
        if thresholds.tuned_param(cfg):  # on the weights the run saves, before the test rows
            with clock.evaluation():
                tuned = tune_thresholds(cfg, tok, strategy, name, model, validation_files)
        if chief:
            with clock.checkpoint():
                save_hf_checkpoint(model, labels, out / "model", kind.problem_type)
            checkpoint.copy_tokenizer_files(base, out / "model")
        evaluation = None
        if evaluates_here(cfg, name):  # after the save: the model is safe whatever happens
            validating_s = clock.evaluation_s  # the validation evaluations' share
            with clock.evaluation():
                metrics = evaluate.evaluate_model(
                    cfg, tok, strategy, name, model,
                    threshold=thresholds.for_evaluation(cfg, kind.name, tuned))
            evaluation = {"metrics_uri": join_uri(step_uri, EVAL_METRICS),
                          "num_examples": metrics["num_examples"],
                          "seconds": round(clock.evaluation_s - validating_s, 3)}
            if chief:
                storage.write_json(evaluation["metrics_uri"], metrics)
    clock.write()

    if not chief:
        return ctx.manifest_uri("train")
    return write_manifest(step_uri, {
        "model_dir": join_uri(step_uri, "model"),
        "checkpoint_dir": join_uri(step_uri, "checkpoints"),
        "tensorboard_dir": join_uri(step_uri, "tensorboard"),
        "strategy": name,
        "training_loop": cfg.training_loop,
        "mixed_precision": policy,
        "cpu_kernels": kernels,
        "deterministic": cfg.deterministic,
        "group_by_length": groups_by_length(cfg, kind),
        "freeze": {"setting": cfg.freeze, "frozen_weights": frozen},
        "layer_lr_decay": cfg.layer_lr_decay, "head_learning_rate": cfg.head_learning_rate,
        "model_family": model.config.family,
        "base_model": str(base),
        # Source as configured, what it resolved to (Hub commit, champion version, bucket
        # content key) and the files' sizes and sha256: the run's lineage.
        "base_checkpoint": {k: v for k, v in resolved.to_dict().items() if k != "path"},
        "task": kind.name,
        "labels": labels,
        "num_train_examples": tok["splits"]["train"]["num_examples"],
        "num_train_records": window_data.records_of(tok["splits"]["train"]),
        **plan.to_dict(),
        "base_learning_rate": cfg.learning_rate,
        "lr_scaling": cfg.lr_scaling,
        "max_grad_norm": clip_norm(cfg, name),
        "reference_batch_size": cfg.reference_batch_size,
        "steps": int(optimizer.iterations.numpy()),
        "resumed_from_step": start_step,
        # Evaluation on the validation rows: the best step, its value, whether training
        # stopped early and which weights were saved ("best" or "last"); None: no
        # validation rows.
        "validation": validated,
        # Thresholds tuned on the validation rows (tasks/thresholds.py); None: as configured.
        "thresholds": tuned,
        "examples_per_second": progress.examples_per_second,
        "final_loss": progress.epoch_loss,
        "train_seconds": progress.train_seconds,
        # The evaluate step publishes these metrics (tasks/steps/evaluate.py); None: it
        # evaluates the saved model itself.
        "evaluation": evaluation,
    })


def freeze(model, cfg: RunConfig) -> int:
    """Apply `freeze`; the count of frozen weights. A depth the model lacks is refused."""
    if cfg.freeze == "none":
        return 0
    try:
        return model.freeze(*cfg.frozen_layers)
    except ValueError as err:
        raise ConfigError("freeze", f"{cfg.freeze}: {err}; freeze fewer layers") from None


def check_validation(cfg: RunConfig, tok: dict, plan: model_lib.TrainPlan, name: str) -> None:
    """Refuse, before any model is loaded, validation settings this run cannot honour."""
    if cfg.validates_in_train and "validation" not in tok["splits"]:
        raise ConfigError("eval_every_steps", "this run's data has no validation split; run "
                                              "the data step again with this config")
    if cfg.eval_every_steps > plan.total_steps:
        raise ConfigError("eval_every_steps", f"{cfg.eval_every_steps} is more than the "
                                              f"run's {plan.total_steps} steps: no evaluation "
                                              "would run before the last step; lower it")


def check_thresholds(cfg: RunConfig, tok: dict) -> None:
    """Refuse, before any model is loaded, thresholds this run's data cannot take."""
    tuned = thresholds.tuned_param(cfg)
    if tuned and "validation" not in tok["splits"]:
        raise ConfigError(tuned, "tuned, but this run's data has no validation split: set "
                                 "validation_uri or validation_fraction and run the data step "
                                 "again with this config")
    if cfg.task == "classification" and cfg.decision_threshold != thresholds.FALLBACK and \
            len(tok["labels"]) != 2:
        raise ConfigError("decision_threshold", f"applies to two labels; this run's data has "
                                                f"{len(tok['labels'])}: leave it at 0.5")


def tune_thresholds(cfg: RunConfig, tok: dict, strategy, name: str, model,
                    files: list[str]) -> dict:
    """Thresholds chosen on the validation shards `files` (every worker counts its share;
    under parameter_server the chief alone, as its validation evaluations run)."""
    if name == "parameter_server":
        strategy, name = tf.distribute.OneDeviceStrategy("/cpu:0"), "one_device"
    record = evaluate.tuned_thresholds(cfg, tok, strategy, name, model, files)
    chosen = ", ".join(f"{label} {entry['threshold']}" + (" (fallback)" * entry["fallback"])
                       for label, entry in record["per_label"].items())
    print(f"train: {record['param']} tuned on {record['validation_rows']} validation rows "
          f"for {record['metric']}: {chosen}", flush=True)
    return record


def pruning_hook(cfg: RunConfig, ctx: RunContext, strategy, name: str, chief: bool,
                 validator: validation.Validator):
    """A sweep trial's pruning decision (tasks/runs/pruning.py) as the Validator calls it:
    the chief reads the other trials' figures and decides, and every worker of a lockstep
    cluster learns the decision through one collective (they must all stop at one step).
    None: this run is no trial of a pruning sweep."""
    pruner = pruning.for_run(ctx.run_uri, cfg.gate_metric_name,
                             validator.every or validator.epoch)
    if pruner is None:
        return None
    agree = strategy_lib.any_worker(strategy, name)

    def decide(step: int, value: float) -> str | None:
        reason = pruner.check(step, value) if chief else None
        if agree(reason is not None):
            return reason or f"pruned at step {step} (the chief's decision)"
        return None
    return decide


@contextmanager
def validation_shards(tok: dict) -> Iterator[list[str] | None]:
    """The local validation shards when the run has validation rows (else None)."""
    if "validation" not in tok["splits"]:
        yield None
        return
    with inputs.local_shards(tok, "validation") as files:
        yield files


def evaluates_here(cfg: RunConfig, name: str) -> bool:
    """Whether the train step evaluates its model (evaluate_in_train). Not under
    parameter_server: its evaluation runs on the chief alone (tasks/steps/evaluate.py)."""
    return cfg.evaluate_in_train and name != "parameter_server"


def clip_norm(cfg: RunConfig, strategy: str) -> float:
    """The global norm the optimizer clips to (0: none): max_grad_norm, or when it is empty
    DEFAULT_CLIP_NORM, except under central_storage, where Keras cannot clip (parse_config
    refuses a value over 0 there)."""
    if cfg.max_grad_norm is not None:
        return cfg.max_grad_norm
    return 0.0 if strategy == "central_storage" else DEFAULT_CLIP_NORM


def groups_by_length(cfg: RunConfig, kind: TaskKind) -> bool:
    """Whether training batches group rows by length: group_by_length, or when it is empty,
    the task's default (TaskKind.groups_by_length: single-label classification only)."""
    if cfg.group_by_length is not None:
        return cfg.group_by_length
    return kind.groups_by_length


def describe_plan(cfg: RunConfig, plan: model_lib.TrainPlan, name: str, policy: str,
                  cpu_kernels: bool = False) -> str:
    """The start-of-training log line: how the global batch, the learning rate and the step
    counts were derived."""
    ratio = f"{plan.global_batch_size}/{cfg.reference_batch_size}"
    rule = {"none": "no scaling", "linear": f"x {ratio}", "sqrt": f"x sqrt({ratio})"}
    return (f"train: strategy {name}, {plan.num_replicas} replicas x "
            f"{plan.per_replica_batch_size} per replica x {plan.grad_accum_steps} accumulation "
            f"= global batch {plan.global_batch_size}; learning rate {cfg.learning_rate:.4g} "
            f"({cfg.lr_scaling}: {rule[cfg.lr_scaling]}) = {plan.learning_rate:.4g}; "
            f"{plan.steps_per_epoch} steps per epoch, {plan.total_steps} steps in "
            f"{plan.epochs} epochs ({plan.warmup_steps} warm-up); gradient clipping "
            f"{clip_norm(cfg, name) or 'off'}; precision {policy}; "
            f"bertflow CPU kernels {'on' if cpu_kernels else 'off'}")


@contextmanager
def _output_dir(step_uri: str, chief: bool) -> Iterator[Path]:
    """A local folder for this process's outputs: the (staged) step folder for the chief, a
    throwaway one for other workers, which must still save to keep collectives in step.

    A throwaway folder starts with a copy of the chief's checkpoints: on a restart every
    worker must resume from the same step and weights, or the replicas would diverge (the
    workers' own checkpoints died with their temporary folders)."""
    if not chief:
        with tempfile.TemporaryDirectory(prefix="bertflow-worker-") as tmp:
            checkpoint_publish.fetch_latest(join_uri(step_uri, "checkpoints"),
                                            Path(tmp) / "checkpoints")
            yield Path(tmp)
        return
    with storage.staged_local_dir(step_uri, "w") as out:
        remote = not storage.is_local(step_uri)
        if remote:  # resume from the newest published checkpoint
            checkpoint_publish.fetch_latest(join_uri(step_uri, "checkpoints"),
                                            out / "checkpoints")
        yield out
        if remote:  # every checkpoint was published as it was written: not sent again
            shutil.rmtree(out / "checkpoints", ignore_errors=True)


class Progress(tf_keras.callbacks.Callback):
    """Logs loss and examples/s to stdout and TensorBoard every `every` steps. Throughput is
    measured from the end of the first step, so graph tracing is not counted."""

    def __init__(self, plan: model_lib.TrainPlan, tb_dir: Path, history: History | None = None,
                 clock: GoodputClock | None = None, metric: str = "accuracy"):
        super().__init__()
        self.plan, self.clock = plan, clock
        self.metric = metric  # the task's training metric, logged next to the loss
        self.history = history
        self.started = time.perf_counter()
        self.every = max(1, min(100, plan.total_steps // 10))
        self.writer = tf.summary.create_file_writer(str(tb_dir / "train"))
        self.first: tuple[int, float, float] | None = None  # (step, time, paused())
        # Seconds spent outside training steps (validation evaluations), left out of the
        # throughput: a function returning their running total.
        self.paused = lambda: 0.0
        self.last: tuple[int, float, float] | None = None
        self.epoch_loss: float | None = None

    def step_done(self, step: int, metrics: dict[str, float]) -> None:
        """`metrics`: loss, the task's metric and learning_rate at this optimizer step."""
        if self.clock is not None:
            self.clock.step_done(step)
        now = time.perf_counter()
        if self.first is None:
            self.first = (step, now, self.paused())
        self.last = (step, now, self.paused())
        if self.history is not None:
            self.history.step_done(step, metrics, now - self.started)
        if step % self.every and step < self.plan.total_steps:
            return
        speed = self.examples_per_second or 0.0
        print(f"step {step}/{self.plan.total_steps} loss {metrics['loss']:.4f} {self.metric} "
              f"{metrics[self.metric]:.3f} {speed:.1f} examples/s", flush=True)
        with self.writer.as_default(step=step):
            for tag, value in {**metrics, "examples_per_second": speed}.items():
                tf.summary.write(tag, tf.constant(value, tf.float32), metadata=SCALAR)
        self.writer.flush()

    @property
    def examples_per_second(self) -> float | None:
        if self.first is None or self.last[0] == self.first[0]:
            return None
        steps = self.last[0] - self.first[0]
        seconds = (self.last[1] - self.first[1]) - (self.last[2] - self.first[2])
        return round(steps * self.plan.global_batch_size / seconds, 2)

    @property
    def train_seconds(self) -> float | None:
        """From the start of training (this attempt) to its last step."""
        return None if self.last is None else round(self.last[1] - self.started, 2)

    def on_train_batch_end(self, batch, logs=None):
        optimizer = self.model.optimizer
        self.step_done(int(optimizer.iterations.numpy()), {
            "loss": float(logs["loss"]), self.metric: float(logs[self.metric]),
            "learning_rate": model_lib.current_learning_rate(optimizer)})

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_loss = float(logs["loss"])


class History:
    """`train/history.json`, a small training history the bertflow page draws without
    TensorFlow: `{"total_steps", "steps_per_epoch", "every", "records": [{"step", "epoch",
    "loss", "accuracy", "learning_rate", "elapsed_seconds"}]}` (the task's training metric in
    place of accuracy: label_accuracy for multi-label, mse for regression). About `POINTS`
    records per run (every `every` steps, the first and the last step), buffered and written
    whole (it is small, and gs:// / s3:// objects cannot be appended to) at each epoch end and
    at the last step. With validation rows, `"validation": [{"step", "epoch", the metrics,
    "seconds"}]` (one per evaluation, written as it ends) and `"best"` (the Validator's
    summary). A resumed run keeps the records up to the step it resumes from."""

    POINTS = 200

    def __init__(self, uri: str, plan: model_lib.TrainPlan, start_step: int = 0):
        self.uri, self.plan = uri, plan
        self.every = max(1, plan.total_steps // self.POINTS)
        self.records: list[dict] = []
        self.validation: list[dict] = []
        self.best: dict | None = None
        if start_step and storage.exists(uri):
            written = storage.read_json(uri)
            self.records = [r for r in written.get("records", []) if r["step"] <= start_step]
            self.validation = [r for r in written.get("validation", [])
                               if r["step"] <= start_step]
        self.written_epoch = start_step // plan.steps_per_epoch

    def validation_done(self, record: dict, best: dict) -> None:
        self.validation.append(record)
        self.best = best
        self.write()

    def step_done(self, step: int, metrics: dict[str, float], elapsed: float) -> None:
        last = step >= self.plan.total_steps
        if step % self.every == 0 or last or not self.records:
            self.records.append({"step": step, "epoch": round(step / self.plan.steps_per_epoch, 3),
                                 **{k: float(v) for k, v in metrics.items()},
                                 "elapsed_seconds": round(elapsed, 3)})
        if last or step // self.plan.steps_per_epoch > self.written_epoch:
            self.written_epoch = step // self.plan.steps_per_epoch
            self.write()

    def write(self) -> None:
        written = {"total_steps": self.plan.total_steps,
                   "steps_per_epoch": self.plan.steps_per_epoch, "every": self.every,
                   "records": self.records}
        if self.validation:
            written.update(validation=self.validation, best=self.best)
        storage.write_json(self.uri, written)




class Saver:
    """The end of each optimizer step: the validation evaluation when one is due (first, so
    a checkpoint of this step holds its result), a checkpoint at every multiple of `every`
    steps (then `after_save`), and at the step the cluster agrees to stop at when preempted
    (then raises Preempted)."""

    def __init__(self, manager: tf.train.CheckpointManager, every: int, after_save=None,
                 clock: GoodputClock | None = None,
                 agreement: preemption.Agreement | None = None,
                 validator: validation.Validator | None = None):
        self.manager, self.every, self.after_save = manager, every, after_save
        self.clock, self.agreement, self.validator = clock, agreement, validator
        self.last_saved: int | None = None

    @property
    def early_stopped(self) -> bool:
        return self.validator is not None and self.validator.stopped

    def step_done(self, step: int) -> None:
        if self.validator is not None and self.validator.pending(step):
            with self.clock.evaluation() if self.clock else nullcontext():
                self.validator.step_done(step)
        if step % self.every == 0:
            self.save(step)
        if self.agreement is not None and self.agreement.should_stop():
            self.save(step)
            raise preemption.Preempted(step)

    def save(self, step: int) -> None:
        if step == self.last_saved:
            return
        if self.clock is None:
            self._save(step)
            return
        with self.clock.checkpoint():
            self._save(step)

    def _save(self, step: int) -> None:
        self.manager.save(checkpoint_number=step, options=checkpoint_publish.save_options())
        self.last_saved = step
        if self.after_save is not None:
            self.after_save()


class _StepCallbacks(tf_keras.callbacks.Callback):
    """Checkpoints during fit and stops at the planned step count (max_steps may end
    training inside an epoch)."""

    def __init__(self, saver: Saver, total_steps: int):
        super().__init__()
        self.saver, self.total_steps = saver, total_steps

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        self.saver.step_done(step)
        if step >= self.total_steps or self.saver.early_stopped:
            self.model.stop_training = True


def distribute(strategy, name: str, dataset_fn, start_step: int, grad_accum_steps: int = 1):
    """The distributed training input, positioned after the batches `start_step` optimizer
    steps consumed (the pipeline is seeded, so a resumed run sees the batches an uninterrupted
    one would have seen).

    Under mirrored each replica runs its own pipeline on its own share of the files, exactly
    as each one-device worker of multi_worker_mirrored does: N devices in one process and N
    one-device workers then see the same global batches (and the per-device pipelines read
    in parallel)."""
    fn = functools.partial(dataset_fn, skip_batches=start_step * grad_accum_steps)
    options = None
    if name == "mirrored":
        options = tf.distribute.InputOptions(
            experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA)
    return strategy.distribute_datasets_from_function(fn, options)


def _fit(strategy, name, model, optimizer, plan, dataset_fn, saver, progress, kind=None):
    _compile(strategy, model, optimizer, kind, plan)
    start = int(optimizer.iterations.numpy())
    callbacks = [progress, _StepCallbacks(saver, plan.total_steps)]
    if start % plan.steps_per_epoch:
        # Resumed mid-epoch: finish that epoch first, so epochs keep their boundaries. Each
        # fit call reads from its own, seeded stream positioned at its first step.
        model.fit(distribute(strategy, name, dataset_fn, start), epochs=1,
                  steps_per_epoch=plan.steps_per_epoch - start % plan.steps_per_epoch,
                  verbose=0, callbacks=callbacks)
        start = int(optimizer.iterations.numpy())
        if start >= plan.total_steps or saver.early_stopped:
            return
    data = distribute(strategy, name, dataset_fn, start)
    model.fit(data, epochs=plan.epochs, initial_epoch=start // plan.steps_per_epoch,
              steps_per_epoch=plan.steps_per_epoch, verbose=0, callbacks=callbacks)


def _compile(strategy, model, optimizer, kind: TaskKind | None = None,
             plan: model_lib.TrainPlan | None = None) -> None:
    kind = kind or task_kind("classification")
    loss = kind.keras_loss(label_smoothing=plan.label_smoothing,
                           class_weights=plan.class_weights,
                           pieces_per_row=plan.pieces_per_row) if plan else kind.keras_loss()
    with strategy.scope():  # metrics must live in the model's strategy
        model.compile(optimizer=optimizer, loss=loss,
                      metrics=[kind.keras_metric()])
    # Logged loss/accuracy are metric results, already aggregated over replicas; Keras'
    # default ("auto") would add them up again across workers.
    model.distribute_reduction_method = "first"


def _fit_in_chunks(strategy, name, model, optimizer, plan, dataset_fn, saver, progress,
                   kind=None):
    """fit under ParameterServer, which allows no batch-level callbacks: one fit call per
    checkpoint interval, logging and saving in between."""
    _compile(strategy, model, optimizer, kind, plan)
    progress.every = saver.every
    step = int(optimizer.iterations.numpy())
    while step < plan.total_steps and not saver.early_stopped:
        chunk = min(saver.every - step % saver.every, plan.total_steps - step)
        if saver.validator is not None:  # a chunk ends at each validation step too
            chunk = min(chunk, saver.validator.next_due(step) - step)
        # Each call starts the workers' input pipelines afresh: a new seed gives new rows. A
        # chunk cut short by a preemption resumes in its own stream, that many batches in.
        first = step - step % saver.every
        data = tf_keras.utils.experimental.DatasetCreator(
            functools.partial(dataset_fn, seed_offset=first, skip_batches=step - first))
        logs = model.fit(data, epochs=1, steps_per_epoch=chunk, verbose=0).history
        step = int(optimizer.iterations.numpy())
        progress.epoch_loss = logs["loss"][-1]
        progress.step_done(step, {"loss": logs["loss"][-1],
                                  progress.metric: logs[progress.metric][-1],
                                  "learning_rate": model_lib.current_learning_rate(optimizer)})
        saver.step_done(step)


def _custom_loop(strategy, name, model, optimizer, plan, dataset_fn, saver, progress,
                 kind=None):
    step = int(optimizer.iterations.numpy())
    iterator = iter(distribute(strategy, name, dataset_fn, step, plan.grad_accum_steps))
    train_step = make_train_step(strategy, model, optimizer, plan, kind)
    epoch_loss, epoch_steps = 0.0, 0
    while step < plan.total_steps:
        loss, metric = (float(x) for x in train_step(iterator))
        step = int(optimizer.iterations.numpy())
        epoch_loss, epoch_steps = epoch_loss + loss, epoch_steps + 1
        progress.step_done(step, {"loss": loss, progress.metric: metric,
                                  "learning_rate": model_lib.current_learning_rate(optimizer)})
        saver.step_done(step)
        if step % plan.steps_per_epoch == 0 or step >= plan.total_steps or \
                saver.early_stopped:
            progress.epoch_loss = epoch_loss / epoch_steps
            epoch_loss, epoch_steps = 0.0, 0
        if saver.early_stopped:
            break


def make_train_step(strategy, model, optimizer, plan: model_lib.TrainPlan,
                    kind: TaskKind | None = None):
    """A tf.function doing one optimizer step from `plan.grad_accum_steps` micro-batches per
    replica; returns (mean loss, the task's metric) over the global batch (`kind`:
    tasks/task_kinds.py, classification by default).

    Each micro-batch loss is divided by the global batch size, so summing gradients over
    micro-batches and (in apply_gradients) over replicas gives the gradient of the mean loss
    over all examples of the step, the same as one large batch. Per-token tasks divide by
    the labelled word pieces of all micro-batches on all replicas instead (counted first:
    tasks/training/token_loss.py), which makes it the mean over the step's labelled pieces.
    """
    kind = kind or task_kind("classification")
    loss_fn = kind.keras_loss(reduction=tf_keras.losses.Reduction.NONE,
                              label_smoothing=plan.label_smoothing,
                              class_weights=plan.class_weights)
    if kind.per_token:
        loss_fn = None
    scaled = isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer)
    with strategy.scope():
        # One private copy per replica: gradients add up locally between updates.
        accumulators = [tf.Variable(tf.zeros_like(v), trainable=False,
                                    synchronization=tf.VariableSynchronization.ON_READ,
                                    aggregation=tf.VariableAggregation.SUM)
                        for v in model.trainable_variables]

    def accumulate(features, labels, denominator=None):
        with tf.GradientTape() as tape:
            logits = model(features, training=True)
            if denominator is None:
                loss = tf.nn.compute_average_loss(loss_fn(labels, logits),
                                                  global_batch_size=plan.global_batch_size)
            else:  # per token: this replica's share of the step's mean over labelled pieces
                sums, _ = token_loss.token_loss_sums(labels, logits, plan.label_smoothing,
                                                     plan.class_weights)
                loss = tf.reduce_sum(sums) / denominator
            scaled_loss = optimizer.get_scaled_loss(loss) if scaled else loss
        grads = tape.gradient(scaled_loss, model.trainable_variables)
        if scaled:
            grads = optimizer.get_unscaled_gradients(grads)
        for acc, grad in zip(accumulators, grads):
            acc.assign_add(tf.cast(grad, acc.dtype))
        return loss, kind.metric_sum(labels, logits)

    def apply():
        optimizer.apply_gradients(zip([acc.read_value() for acc in accumulators],
                                      model.trainable_variables))
        for acc in accumulators:
            acc.assign(tf.zeros_like(acc))

    if kind.per_token:
        return _token_train_step(strategy, plan, accumulate, apply)

    @tf.function
    def train_step(iterator):
        loss, metric = tf.constant(0.0), tf.constant(0.0)
        for micro in tf.range(plan.grad_accum_steps):
            features, labels = next(iterator)
            with seeded_dropout.micro_batch(micro):
                step_loss, step_metric = strategy.run(accumulate, args=(features, labels))
            loss += strategy.reduce(tf.distribute.ReduceOp.SUM, step_loss, axis=None)
            metric += strategy.reduce(tf.distribute.ReduceOp.SUM, step_metric, axis=None)
        strategy.run(apply)
        return loss, metric / plan.global_batch_size

    return train_step


def _token_train_step(strategy, plan: model_lib.TrainPlan, accumulate, apply):
    """make_train_step's step for per-token labels: the step's micro-batches are read first
    (a Python loop: grad_accum_steps is small) so that their labelled pieces, summed over
    replicas, divide every piece's loss and the metric."""
    def labelled(labels):
        return token_loss.labelled_pieces(labels)

    @tf.function
    def train_step(iterator):
        batches = [next(iterator) for _ in range(plan.grad_accum_steps)]
        total = tf.add_n([strategy.reduce(tf.distribute.ReduceOp.SUM,
                                          strategy.run(labelled, args=(labels,)), axis=None)
                          for _, labels in batches])
        counted = tf.maximum(total, 1.0)
        denominator = counted if plan.pieces_per_row is None else tf.constant(
            plan.pieces_per_row * plan.global_batch_size, tf.float32)
        loss, metric = tf.constant(0.0), tf.constant(0.0)
        for micro, (features, labels) in enumerate(batches):
            with seeded_dropout.micro_batch(micro):
                step_loss, step_metric = strategy.run(accumulate,
                                                      args=(features, labels, denominator))
            loss += strategy.reduce(tf.distribute.ReduceOp.SUM, step_loss, axis=None)
            metric += strategy.reduce(tf.distribute.ReduceOp.SUM, step_metric, axis=None)
        strategy.run(apply)
        return loss, metric / counted

    return train_step
