"""Evaluate step: exact metrics of the fine-tuned model over the whole evaluation split.

Each replica turns its batches into a confusion matrix; the matrices are summed across
replicas and workers. Every example lands in exactly one batch of one replica (the partial
last batch is kept, filler rows are ignored), so counts are exact under any strategy, and all
metrics follow from the summed matrix on the host.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tasks.training import checkpoint, inputs, model as model_lib, strategy as strategy_lib
from tasks.io import storage
from tasks.config import RunConfig
from tasks.io.uris import join_uri
from tasks.errors import BertflowError
from tasks.runs.runlayout import RunContext, read_manifest, write_manifest


def run(cfg: RunConfig, ctx: RunContext) -> str:
    name = strategy_lib.strategy_name(cfg)
    if strategy_lib.is_server_task(name):
        strategy_lib.serve_forever()
    if name == "parameter_server":
        # Inline on the coordinator (the chief), on its own device. ParameterServerStrategy
        # evaluates through the ClusterCoordinator, which schedules batches on whichever
        # worker is free and retries the batches of a failed worker: nothing guarantees each
        # row is counted exactly once, which an exact confusion matrix needs. The eval set is
        # small next to the training set, so one process is fast enough; and the chief never
        # connects to the cluster here, so evaluation needs no live workers or ps.
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    else:
        strategy, name = strategy_lib.build_strategy(cfg)
    kind = strategy_lib.device_kind(cfg, name)
    model_lib.set_precision(cfg, kind)  # as in training
    tok = read_manifest(ctx.manifest_uri("tokenize"))
    trained = read_manifest(ctx.manifest_uri("train"))
    labels = tok["labels"]
    expected = tok["splits"]["eval"]["num_examples"]

    with storage.staged_local_dir(trained["model_dir"], "r") as model_dir, \
            inputs.local_shards(tok, "eval") as files:
        with strategy.scope():
            model = checkpoint.load_classifier(
                model_dir, labels, cpu_kernels=strategy_lib.use_cpu_kernels(kind, name))
        matrix = confusion_matrix(strategy, model, files, len(labels),
                                  cfg.eval_batch_size * strategy.num_replicas_in_sync,
                                  static_shapes=name == "tpu", max_seq_length=cfg.max_seq_length)
    if matrix.sum() != expected:
        raise BertflowError(f"evaluated {matrix.sum()} examples but the tokenize manifest "
                            f"lists {expected}; the eval shards changed since tokenize ran")
    metrics = classification_metrics(matrix, labels)
    step_uri = ctx.step_uri("evaluate")
    if not strategy_lib.is_chief():
        return ctx.manifest_uri("evaluate")
    metrics_uri = join_uri(step_uri, "metrics.json")
    storage.write_json(metrics_uri, metrics)
    print(f"evaluate: accuracy {metrics['accuracy']:.4f} macro-F1 {metrics['macro_f1']:.4f} "
          f"on {expected} examples", flush=True)
    return write_manifest(step_uri, {
        "metrics_uri": metrics_uri, "num_examples": metrics["num_examples"],
        "metrics": {"accuracy": metrics["accuracy"], "macro_f1": metrics["macro_f1"]},
        "strategy": name, "model_dir": trained["model_dir"]})


def confusion_matrix(strategy: tf.distribute.Strategy, model, files: list[str],
                     num_labels: int, global_batch_size: int, static_shapes: bool = False,
                     max_seq_length: int = 0) -> np.ndarray:
    """[true label, predicted label] counts over every row of `files`."""
    data = strategy.distribute_datasets_from_function(
        lambda ctx: inputs.eval_dataset(files, global_batch_size, ctx, static_shapes,
                                        max_seq_length))

    def replica_counts(features, labels):
        predicted = tf.argmax(model(features, training=False), -1, output_type=tf.int32)
        real = labels != inputs.PAD_LABEL
        return tf.math.confusion_matrix(tf.boolean_mask(labels, real),
                                        tf.boolean_mask(predicted, real),
                                        num_classes=num_labels, dtype=tf.int64)

    @tf.function  # one trace: the loop runs in the graph over batches of any length
    def count_all():
        total = tf.zeros((num_labels, num_labels), tf.int64)
        for features, labels in data:
            per_replica = strategy.run(replica_counts, args=(features, labels))
            total += strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        return total

    return count_all().numpy()


def classification_metrics(matrix, labels: list[str]) -> dict:
    """Accuracy, macro-F1 and per-class precision/recall/F1/support from a confusion matrix
    (rows: true label, columns: predicted). A ratio with a zero denominator counts as 0."""
    matrix = np.asarray(matrix, dtype=np.int64)
    correct = np.diag(matrix).astype(float)
    support = matrix.sum(axis=1)
    predicted = matrix.sum(axis=0)
    precision = _ratio(correct, predicted)
    recall = _ratio(correct, support)
    f1 = _ratio(2 * precision * recall, precision + recall)
    total = int(matrix.sum())
    return {
        "accuracy": float(correct.sum() / total) if total else 0.0,
        "macro_f1": float(f1.mean()),
        "per_class": {label: {"precision": float(precision[i]), "recall": float(recall[i]),
                              "f1": float(f1[i]), "support": int(support[i])}
                      for i, label in enumerate(labels)},
        "confusion_matrix": matrix.tolist(),
        "labels": list(labels),
        "num_examples": total,
    }


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    out = np.zeros_like(numerator, dtype=float)
    np.divide(numerator, denominator, out=out, where=denominator > 0)
    return out
