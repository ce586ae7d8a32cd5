"""Evaluate step: exact metrics of the fine-tuned model over the whole evaluation split.

Each replica turns its batches into sufficient statistics that add up: for classification a
confusion matrix, for multi-label per-label true/false positives and false negatives plus
exact-match rows (at multi_label_threshold, or the thresholds tuned on the validation rows:
tasks/thresholds.py). They are summed across replicas and workers, never averaged per batch.
Every example lands in exactly one batch of one replica (the partial last batch is kept,
filler rows are ignored), so counts are exact under any strategy, and all metrics follow
from the sums on the host. Entities (token classification) need whole sentences: each
sentence's true and predicted tags are gathered and counted by conlleval's rules on the host
(tasks/training/entity_metrics.py). Regression's Spearman correlation needs ranks, which no
sum gives: its (label, prediction) pairs are gathered from every replica (strategy.gather;
the eval set is small) and MSE, Pearson and Spearman are computed from all of them on the
host in float64.

By default (`evaluate_in_train`) the train step runs `evaluate_model` right after training,
on the model in memory, and this step only checks and publishes its metrics: on small data
sets a process start and a model load cost more than the evaluation itself. Otherwise, and
under parameter_server, this step loads the saved model and evaluates.
"""
from __future__ import annotations

import time

import numpy as np
import tensorflow as tf

from tasks import thresholds
from tasks.model import windows
from tasks.training import checkpoint, determinism, entity_metrics, inputs, model as model_lib
from tasks.training import strategy as strategy_lib
from tasks.io import storage
from tasks.config import RunConfig
from tasks.runs.runlayout import RunContext, read_manifest
from tasks.steps import evaluation_publish
from tasks.task_kinds import (IGNORED, TaskKind, classification_metrics, kind as task_kind,
                              multi_label_metrics, regression_metrics)


def run(cfg: RunConfig, ctx: RunContext) -> str:
    determinism.configure(cfg)  # before any op (the `deterministic` Param)
    name = strategy_lib.strategy_name(cfg)
    if strategy_lib.is_server_task(name):
        strategy_lib.serve_forever()
    tok = read_manifest(ctx.manifest_uri("tokenize"))
    trained = read_manifest(ctx.manifest_uri("train"))
    if evaluation_publish.train_evaluation(cfg, trained):
        # The train step evaluated this model in memory, under its strategy, on the same
        # shards (tasks/steps/train.py). The Airflow controller publishes that without
        # starting workers; this path serves `python -m tasks evaluate` run by hand.
        if not strategy_lib.is_chief():
            return ctx.manifest_uri("evaluate")
        return evaluation_publish.from_train(cfg, ctx, tok, trained)
    started = time.perf_counter()
    if name == "parameter_server":
        # Inline on the coordinator (the chief), on its own device. ParameterServerStrategy
        # evaluates through the ClusterCoordinator, which schedules batches on whichever
        # worker is free and retries the batches of a failed worker: nothing guarantees each
        # row is counted exactly once, which an exact confusion matrix needs. The eval set is
        # small next to the training set, so one process is fast enough; and the chief never
        # connects to the cluster here, so evaluation needs no live workers or ps.
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    elif name == "multi_worker_mirrored" and not strategy_lib.in_cluster():
        # One process of its own (bert_sweep's evaluation of its best trial, whose workers
        # are released): this process's devices.
        strategy, name = strategy_lib.local_strategy(cfg)
    else:
        strategy, name = strategy_lib.build_strategy(cfg)
    device = strategy_lib.device_kind(cfg, name)
    model_lib.set_precision(cfg, device)  # as in training
    kind = task_kind(tok.get("task", "classification"))
    with storage.staged_local_dir(trained["model_dir"], "r") as model_dir:
        with strategy.scope():
            model = checkpoint.load_classifier(
                model_dir, tok["labels"],
                cpu_kernels=strategy_lib.use_cpu_kernels(device, name), head=kind.head)
        metrics = evaluate_model(cfg, tok, strategy, name, model,
                                 threshold=served_threshold(cfg, kind, trained))
    if not strategy_lib.is_chief():
        evaluation_publish.check_count(tok, metrics)  # every worker fails alike
        return ctx.manifest_uri("evaluate")
    return evaluation_publish.publish(ctx, tok, trained, metrics, strategy=name,
                                      evaluated_in="evaluate",
                                      seconds=time.perf_counter() - started)


def served_threshold(cfg: RunConfig, kind: TaskKind, trained: dict):
    """The threshold the exported model serves with (tasks/thresholds.py): the tuned ones
    the train manifest `trained` records, or the configured value."""
    return thresholds.for_evaluation(cfg, kind.name, trained.get("thresholds"))


def evaluate_model(cfg: RunConfig, tok: dict, strategy, name: str, model,
                   split: str = "eval", threshold=None) -> dict:
    """metrics.json's content: every row of the `split` shards that `tok` (the tokenize
    manifest) lists (eval: the test rows), through `model` under `strategy` (`name`), at
    `threshold` (served_threshold). Every worker calls it; the counts are summed or
    gathered across all of them."""
    with inputs.local_shards(tok, split) as files:
        return split_metrics(cfg, tok, strategy, name, model, files, split, threshold)()


def split_metrics(cfg: RunConfig, tok: dict, strategy, name: str, model, files: list[str],
                  split: str = "eval", threshold=None):
    """A function of no arguments returning evaluate_model's metrics of `files` (the local
    shards of `split`) for the model's current weights. Its graphs are traced once, at the
    first call: evaluation during training calls it again at every evaluation. `threshold`
    None: the one of thresholds.during_training (no tuned ones yet)."""
    kind = task_kind(tok.get("task", "classification"))
    if threshold is None:
        threshold = thresholds.during_training(cfg, kind.name)
    compute = metrics_function(kind, strategy, model, files, tok["labels"],
                               cfg.eval_batch_size * strategy.num_replicas_in_sync,
                               threshold, static_shapes=name == "tpu",
                               max_seq_length=cfg.max_seq_length,
                               label_spec=tok.get("label_spec"),
                               aggregation=cfg.window_aggregation)

    def metrics() -> dict:
        out = {"task": kind.name, **compute()}
        if kind.per_token:  # words past max_seq_length have no piece: they are not scored
            out["truncated_sentences"] = tok["splits"][split].get("num_truncated", 0)
        return out
    return metrics


def task_metrics(kind: TaskKind, strategy, model, files: list[str], labels: list[str],
                 global_batch_size: int, threshold=0.5, static_shapes: bool = False,
                 max_seq_length: int = 0, label_spec: dict | None = None) -> dict:
    """metrics.json's content (without "task") for the task's evaluation kind."""
    return metrics_function(kind, strategy, model, files, labels, global_batch_size,
                            threshold, static_shapes, max_seq_length, label_spec)()


def metrics_function(kind: TaskKind, strategy, model, files: list[str], labels: list[str],
                     global_batch_size: int, threshold=0.5, static_shapes: bool = False,
                     max_seq_length: int = 0, label_spec: dict | None = None,
                     aggregation: str = "mean"):
    """task_metrics as a function of no arguments, its input and graphs built once.
    `threshold`: multi-label, one for every label or one per label; classification, the
    binary decision threshold on the second label's probability, or None for argmax.
    Windowed records (long_text window) are scored per text, their windows' logits
    aggregated by `aggregation`."""
    args = (strategy, model, files, global_batch_size, static_shapes, max_seq_length,
            label_spec)
    if inputs.windowed(label_spec) and kind.eval_kind == "entities":
        tags = tag_gathering(*args)
        types = entity_metrics.entity_types(labels)

        def text_entities() -> dict:
            ids, truth, predicted = tags()
            truth, predicted = entity_metrics.words_by_text(ids, truth, predicted)
            names = np.asarray(labels, dtype=object)
            counted = entity_metrics.count_entities(
                [names[t] for t in truth], [names[p] for p in predicted], types)
            return {**entity_metrics.entity_scores(counted, types), "labels": list(labels),
                    "num_examples": len(truth)}
        return text_entities
    if inputs.windowed(label_spec):
        found = window_gathering(*args, num_logits=len(labels))
        score = text_scores(kind, labels, threshold)
        return lambda: score(*windows.by_text(*found(), aggregation))
    if kind.eval_kind == "confusion":
        counts = summing(*args, confusion_counts(len(labels), threshold))
        return lambda: classification_metrics(counts(), labels)
    if kind.eval_kind == "label_counts":
        counts = summing(*args, multi_label_counts(len(labels), threshold))
        return lambda: _multi_label(counts(), labels, threshold)
    if kind.eval_kind == "entities":
        tags = tag_gathering(*args)
        types = entity_metrics.entity_types(labels)

        def entities() -> dict:
            truth, predicted = tags()
            counted = entity_metrics.count_entity_ids(truth, predicted, labels)
            return {**entity_metrics.entity_scores(counted, types), "labels": list(labels),
                    "num_examples": len(truth)}
        return entities
    pairs = pair_gathering(*args)
    return lambda: regression_metrics(*pairs())


def _multi_label(total: np.ndarray, labels: list[str], threshold) -> dict:
    n = len(labels)
    return multi_label_metrics({"per_label": total[:3 * n].reshape(3, n),
                                "exact": total[3 * n], "rows": total[3 * n + 1]},
                               labels, _plain(threshold))


def text_scores(kind: TaskKind, labels: list[str], threshold):
    """A function (truth [texts, label width], logits [texts, outputs]) -> the task's
    metrics, on the host: the same counters and metrics as the per-row path."""
    if kind.eval_kind == "confusion":
        counts = confusion_counts(len(labels), threshold)[0]
        return lambda truth, logits: classification_metrics(
            counts(tf.cast(truth[:, 0], tf.int32), logits).numpy(), labels)
    if kind.eval_kind == "label_counts":
        counts = multi_label_counts(len(labels), threshold)[0]
        return lambda truth, logits: _multi_label(counts(truth, logits).numpy(), labels,
                                                  threshold)
    return lambda truth, logits: regression_metrics(truth[:, 0], logits[:, 0])


def confusion_matrix(strategy: tf.distribute.Strategy, model, files: list[str],
                     num_labels: int, global_batch_size: int, static_shapes: bool = False,
                     max_seq_length: int = 0) -> np.ndarray:
    """[true label, predicted label] counts over every row of `files`."""
    return summing(strategy, model, files, global_batch_size, static_shapes, max_seq_length,
                   None, confusion_counts(num_labels))()


def _plain(threshold):
    """A threshold as metrics.json records it: a number, or a list of one per label."""
    return [float(t) for t in threshold] if isinstance(threshold, (list, tuple)) else threshold


def positive_probability(logits):
    """Binary classification: the second label's softmax probability, float32 [batch]."""
    return tf.nn.softmax(tf.cast(logits, tf.float32), axis=-1)[:, 1]


def confusion_counts(num_labels: int, decision_threshold: float | None = None):
    """(counts of one batch's real rows, zeros): a [label, prediction] matrix. The
    prediction is the argmax, or with a binary `decision_threshold` the second label where
    its probability is over it."""
    def counts(labels, logits):
        predicted = tf.argmax(logits, -1, output_type=tf.int32)
        if decision_threshold is not None:
            predicted = tf.cast(positive_probability(logits) > decision_threshold, tf.int32)
        return tf.math.confusion_matrix(labels, predicted, num_classes=num_labels,
                                        dtype=tf.int64)
    return counts, tf.zeros((num_labels, num_labels), tf.int64)


def multi_label_counts(num_labels: int, threshold):
    """(counts, zeros): per label true positives, false positives, false negatives, then
    the rows whose every label is right and the rows, as one int64 vector [3L + 2]. A label
    is predicted when its sigmoid is over `threshold` (one, or one per label), as the
    exported model decides."""
    bound = tf.constant(threshold, tf.float32)

    def counts(labels, logits):
        predicted = tf.sigmoid(tf.cast(logits, tf.float32)) > bound
        truth = labels > 0.5
        both = tf.cast(predicted & truth, tf.int64)
        tp = tf.reduce_sum(both, 0)
        fp = tf.reduce_sum(tf.cast(predicted, tf.int64), 0) - tp
        fn = tf.reduce_sum(tf.cast(truth, tf.int64), 0) - tp
        exact = tf.reduce_sum(tf.cast(tf.reduce_all(predicted == truth, -1), tf.int64))
        rows = tf.shape(labels, out_type=tf.int64)[:1]
        return tf.concat([tp, fp, fn, [exact], rows], 0)
    return counts, tf.zeros([3 * num_labels + 2], tf.int64)


def threshold_counts(kind: TaskKind, num_labels: int, grid=thresholds.GRID):
    """(counts, zeros) for tuning thresholds (tasks/thresholds.choose): for each label (a
    binary classification: the second label) and each threshold t of `grid`, the rows whose
    probability is over t and the true positives among them, then each label's positives
    and the rows, as one int64 vector [2 x labels x grid + labels + 1]. One pass over the
    rows gives every threshold's F1."""
    bound = tf.constant(grid, tf.float32)
    if kind.name == "classification":
        num_labels = 1

    def counts(labels, logits):
        if kind.name == "classification":
            probability = positive_probability(logits)[:, None]
            truth = tf.equal(tf.reshape(labels, [-1, 1]), 1)
        else:
            probability, truth = tf.sigmoid(tf.cast(logits, tf.float32)), labels > 0.5
        over = probability[:, :, None] > bound  # [rows, labels, grid]
        tp = tf.reduce_sum(tf.cast(over & truth[:, :, None], tf.int64), 0)
        predicted = tf.reduce_sum(tf.cast(over, tf.int64), 0)
        positives = tf.reduce_sum(tf.cast(truth, tf.int64), 0)
        rows = tf.shape(probability, out_type=tf.int64)[:1]
        return tf.concat([tf.reshape(tp, [-1]), tf.reshape(predicted, [-1]), positives,
                          rows], 0)
    return counts, tf.zeros([2 * num_labels * len(grid) + num_labels + 1], tf.int64)


def tuned_thresholds(cfg: RunConfig, tok: dict, strategy, name: str, model,
                     files: list[str]) -> dict:
    """The train manifest's `thresholds` record: each label's threshold chosen on the
    validation shards `files` for the model's current weights (tasks/thresholds.py).
    Binary classification: the second of its two labels."""
    kind = task_kind(tok.get("task", "classification"))
    labels = tok["labels"]
    batch = cfg.eval_batch_size * strategy.num_replicas_in_sync
    args = (strategy, model, files, batch, name == "tpu", cfg.max_seq_length,
            tok.get("label_spec"))
    if inputs.windowed(tok.get("label_spec")):
        # Texts, not windows, are counted: the windows' logits are aggregated per text first,
        # as the test metrics and the SavedModel do.
        found = window_gathering(*args, num_logits=len(labels))
        per_text = threshold_counts(kind, len(labels))[0]

        def count():
            truth, logits = windows.by_text(*found(), cfg.window_aggregation)
            return per_text(tf.constant(truth), tf.constant(logits)).numpy()
    else:
        count = summing(*args, threshold_counts(kind, len(labels)))
    if kind.name == "classification":
        record = thresholds.choose(count(), labels[1:], cfg.decision_threshold_metric,
                                   "decision_threshold")
        return {**record, "positive_label": labels[1]}
    return thresholds.choose(count(), labels)


def eval_data(strategy, files, global_batch_size, static_shapes, max_seq_length, label_spec):
    return strategy.distribute_datasets_from_function(
        lambda ctx: inputs.eval_dataset(files, global_batch_size, ctx, static_shapes,
                                        max_seq_length, label_spec))


def _real_rows(model, features, labels):
    """(labels, logits) of a batch's real rows (filler rows dropped)."""
    features, labels = tf.nest.map_structure(_one_position_at_least, (features, labels))
    real = inputs.is_real(labels)
    logits = model(features, training=False)
    return tf.boolean_mask(labels, real), tf.boolean_mask(logits, real)


def _one_position_at_least(tensor: tf.Tensor) -> tf.Tensor:
    """A replica left without rows at the end of the data (its share of the batches is one
    short) gets tf.distribute's dummy batch, whose unknown dimensions are all 0: a sequence of
    length 0, which the model cannot attend over. One padded position makes it a batch of
    0 rows of length 1 (no row, so nothing is counted); real batches are unchanged."""
    if tensor.shape.rank is None or tensor.shape.rank < 2 or tensor.shape[1] is not None:
        return tensor  # a known length (the TPU's padded path) is never 0
    missing = tf.maximum(0, 1 - tf.shape(tensor)[1])
    return tf.pad(tensor, [[0, 0], [0, missing]] + [[0, 0]] * (tensor.shape.rank - 2))


def summing(strategy, model, files, global_batch_size, static_shapes, max_seq_length,
            label_spec, counter):
    """counter = (counts(labels, logits) -> tensor, zeros): a function returning the counts
    of every row of `files`, summed over batches, replicas and workers."""
    data = eval_data(strategy, files, global_batch_size, static_shapes, max_seq_length,
                     label_spec)
    loop = count_loop(strategy, model, data, counter)
    return lambda: loop().numpy()


def fold(data, initial, add_batch):
    """A tf.function folding add_batch(state, (features, labels)) over every batch of the
    distributed dataset `data`, from initial() (called in the graph): one trace, one graph
    loop over batches of any length. It is `reduce` of tf.distribute's datasets, the loop
    AutoGraph makes of a Python `for` over them, written out with AutoGraph off: the same
    graph, traced 0.07-0.15 s faster in a fresh process (computed from the archived
    benchmarks/results/archive/evaluation_floor_2026-12-05_autograph_loop.json and
    ..._optimizer_on_only.json, datasets.*.medians.bertflow.trace_s),
    and no loop that AutoGraph fails to convert, which runs as Python instead and unrolls
    every batch into the graph."""
    return tf.function(lambda: data.reduce(initial(), add_batch), autograph=False)


def count_loop(strategy, model, data, counter):
    """A tf.function summing counter's counts over every batch of the distributed dataset
    `data` (benchmarks/evaluation_floor.py times its trace and runs apart)."""
    counts, zeros = counter

    def replica_counts(features, labels):
        return counts(*_real_rows(model, features, labels))

    def add_batch(total, batch):
        per_replica = strategy.run(replica_counts, args=batch)
        return total + strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return fold(data, lambda: zeros, add_batch)


def gathered_pairs(strategy, model, files, global_batch_size, static_shapes=False,
                   max_seq_length=0, label_spec=None) -> tuple[np.ndarray, np.ndarray]:
    """(true scores, predicted scores) of every row of `files`, gathered from every replica
    and worker (each row once; the order does not matter to the metrics)."""
    return pair_gathering(strategy, model, files, global_batch_size, static_shapes,
                          max_seq_length, label_spec)()


def pair_gathering(strategy, model, files, global_batch_size, static_shapes=False,
                   max_seq_length=0, label_spec=None):
    """gathered_pairs as a function of no arguments, its graph traced once."""
    data = eval_data(strategy, files, global_batch_size, static_shapes, max_seq_length,
                     label_spec)
    # Each replica hands over a block of the per-replica batch size, its rows padded with
    # NaN (dropped on the host): the collective gather across workers needs the same shape
    # from every replica, and a replica's batch may be partial or empty at the end.
    block = global_batch_size // strategy.num_replicas_in_sync

    def replica_pairs(features, labels):
        truth, logits = _real_rows(model, features, labels)
        pairs = tf.concat([tf.reshape(truth, [-1, 1]), logits[:, :1]], 1)
        return tf.pad(pairs, [[0, block - tf.shape(pairs)[0]], [0, 0]],
                      constant_values=float("nan"))

    def add_batch(pairs, batch):
        per_replica = strategy.run(replica_pairs, args=batch)
        return tf.concat([pairs, strategy.gather(per_replica, axis=0)], 0)

    # A loop variable that grows: its static shape must say so from the start.
    loop = fold(data, lambda: tf.compat.v1.placeholder_with_default(
        tf.zeros([0, 2]), shape=[None, 2]), add_batch)

    def pairs() -> tuple[np.ndarray, np.ndarray]:
        found = loop().numpy()
        found = found[~np.isnan(found[:, 0])]
        return found[:, 0], found[:, 1]
    return pairs


def window_gathering(strategy, model, files, global_batch_size, static_shapes=False,
                     max_seq_length=0, label_spec=None, num_logits=1):
    """A function of no arguments returning (text ids, labels, logits) of every window of
    `files` (long_text window), gathered from every replica and worker: a text's windows may
    sit in different batches and replicas, so they are put together on the host
    (windows.by_text), never per batch. Its graph is traced once."""
    data = eval_data(strategy, files, global_batch_size, static_shapes, max_seq_length,
                     label_spec)
    block = global_batch_size // strategy.num_replicas_in_sync
    shape = (label_spec or inputs.CLASS_LABEL)["shape"]
    width = int(np.prod(shape)) + num_logits  # label values, then logits

    def replica_windows(features, labels):
        features = dict(features)
        # int32: what every device gathers (TPUs hold no int64).
        text_id = tf.boolean_mask(tf.cast(features.pop("text_id"), tf.int32),
                                  inputs.is_real(labels))
        truth, logits = _real_rows(model, features, labels)
        rows = tf.concat([tf.reshape(tf.cast(truth, tf.float32), [-1, width - num_logits]),
                          tf.cast(logits, tf.float32)], 1)
        # Same shape from every replica for the collective gather: -1 ids mark filler.
        missing = block - tf.shape(rows)[0]
        return (tf.pad(text_id, [[0, missing]], constant_values=-1),
                tf.pad(rows, [[0, missing], [0, 0]]))

    def add_batch(found, batch):
        ids, rows = strategy.run(replica_windows, args=batch)
        return (tf.concat([found[0], strategy.gather(ids, axis=0)], 0),
                tf.concat([found[1], strategy.gather(rows, axis=0)], 0))

    loop = fold(data, lambda: (
        tf.compat.v1.placeholder_with_default(tf.zeros([0], tf.int32), shape=[None]),
        tf.compat.v1.placeholder_with_default(tf.zeros([0, width]), shape=[None, width])),
        add_batch)

    def found() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ids, rows = (x.numpy() for x in loop())
        real = ids >= 0
        rows = rows[real]
        return ids[real], rows[:, :width - num_logits], rows[:, width - num_logits:]
    return found


def gathered_tags(strategy, model, files, global_batch_size, static_shapes=False,
                  max_seq_length=0, label_spec=None) -> tuple[np.ndarray, np.ndarray]:
    """(true tag ids, predicted tag ids), int32 [sentences, max_seq_length] each, of every
    sentence of `files`, gathered from every replica and worker (each sentence once): the
    entity counts need whole sentences, which no per-batch sum gives. Positions that score
    nothing hold IGNORED in the truth (tasks/training/entity_metrics.py skips them)."""
    return tag_gathering(strategy, model, files, global_batch_size, static_shapes,
                         max_seq_length, label_spec)()


def tag_gathering(strategy, model, files, global_batch_size, static_shapes=False,
                  max_seq_length=0, label_spec=None):
    """gathered_tags as a function of no arguments, its graph traced once."""
    data = eval_data(strategy, files, global_batch_size, static_shapes, max_seq_length,
                     label_spec)
    block = global_batch_size // strategy.num_replicas_in_sync

    windowed = inputs.windowed(label_spec)
    width = max_seq_length + (1 if windowed else 0)

    def replica_tags(features, labels):
        features = dict(features)
        text_id = features.pop("text_id", None)
        labels = _one_position_at_least(labels)  # is_real reads a first position
        truth, logits = _real_rows(model, features, labels)
        predicted = tf.argmax(logits, -1, output_type=tf.int32)
        both = tf.stack([tf.cast(truth, tf.int32), predicted], 1)  # [rows, 2, width]
        both = tf.pad(both, [[0, 0], [0, 0], [0, max_seq_length - tf.shape(both)[2]]],
                      constant_values=IGNORED)
        if windowed:  # a first column of [text, window] (windows.max_context's words)
            text_id = tf.boolean_mask(tf.cast(text_id, tf.int32), inputs.is_real(labels))
            both = tf.concat([text_id[:, :, None], both], 2)
        # Rows that fill the block are marked PAD_LABEL at [CLS], where a sentence has
        # IGNORED: the collective gather needs the same shape from every replica.
        return tf.pad(both, [[0, block - tf.shape(both)[0]], [0, 0], [0, 0]],
                      constant_values=inputs.PAD_LABEL)

    def add_batch(tags, batch):
        per_replica = strategy.run(replica_tags, args=batch)
        return tf.concat([tags, strategy.gather(per_replica, axis=0)], 0)

    loop = fold(data, lambda: tf.compat.v1.placeholder_with_default(
        tf.zeros([0, 2, width], tf.int32), shape=[None, 2, width]), add_batch)

    def tags() -> tuple[np.ndarray, ...]:
        found = loop().numpy()
        found = found[found[:, 0, width - max_seq_length] != inputs.PAD_LABEL]
        if windowed:  # (text ids [rows, 2], truth, predicted)
            return found[:, :, 0], found[:, 0, 1:], found[:, 1, 1:]
        return found[:, 0], found[:, 1]
    return tags
