"""What differs between tasks, in one table: every `if task == ...` of the pipeline is a
field of `TaskKind` here, so a new task is a new row (token classification is the next).

A row says how a label cell is read (data step), stored (prepared rows, TFRecords), learned
(loss, training metric), counted (evaluation's sufficient statistics and metrics), gated
(promote), served (SavedModel outputs) and named for Hugging Face (problem_type). The
conventions follow transformers' (DESIGN.md, "Model families and tasks"): multi-label is
`problem_type="multi_label_classification"` with float multi-hot labels and BCEWithLogits;
regression is num_labels 1 with MSELoss.

Pure Python at import (tasks.config imports it); TensorFlow is imported inside the functions
that build graph pieces, which only the worker steps call.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

TASKS = ("classification", "multi_label", "regression", "token_classification")
# The label of word pieces that score nothing (all but a word's first, [CLS], [SEP], padding),
# as transformers and torch's CrossEntropyLoss ignore_index.
IGNORED = -100


class LabelError(ValueError):
    """A label cell this task cannot read; the data step turns it into a DataError naming
    the file and line. `hint` says what to change."""

    def __init__(self, reason: str, hint: str = ""):
        super().__init__(reason)
        self.reason, self.hint = reason, hint


# --- reading a label cell ----------------------------------------------------------------
def _class_label(raw, delimiter: str):
    if isinstance(raw, list):
        raise LabelError("the label is a list; a classification row has one label",
                         hint="set task to multi_label for rows with several labels")
    return raw


def _multi_label(raw, delimiter: str):
    """A JSON list of names (JSON Lines) or names joined by `delimiter`; names are stripped,
    empty ones dropped, repeats kept once in their first position."""
    names = raw if isinstance(raw, list) else str(raw).split(delimiter)
    cleaned = list(dict.fromkeys(str(n).strip() for n in names if str(n).strip()))
    if not cleaned:
        raise LabelError("no label in this multi-label row",
                         hint="give at least one label name, or remove the row")
    return cleaned


def _score(raw, delimiter: str):
    if isinstance(raw, list):
        raise LabelError("the label is a list; regression needs one number",
                         hint="set task to multi_label for rows with several labels")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise LabelError(f"regression needs a number in the label column, found {raw!r}",
                         hint="set task to classification for named labels, or fix the "
                              "row") from None
    if not math.isfinite(value):
        raise LabelError(f"label {raw!r} is not a finite number", hint="fix the row")
    return value


@dataclass(frozen=True)
class Mismatch:
    label: str  # the example named in the error (its first line is reported)
    reason: str
    hint: str


def _check_class_labels(counts, rows: int, delimiter: str):
    """Classification labels that look like another task's: most rows hold the delimiter
    (several labels per row: multi_label), or the labels are many distinct numbers with
    fractions (scores: regression)."""
    joined = [label for label in counts if delimiter in label]
    if joined and sum(counts[label] for label in joined) > 0.5 * rows:
        return Mismatch(joined[0], f"most labels contain the label delimiter {delimiter!r} "
                                   f"(e.g. {joined[0]!r}): several labels per row?",
                        "set task to multi_label, or label_delimiter to a character the "
                        "label names do not contain")
    numbers = [label for label in counts if _is_number(label)]
    if len(counts) >= 10 and len(numbers) == len(counts) and any(
            not float(label).is_integer() for label in numbers):
        example = next(label for label in numbers if not float(label).is_integer())
        return Mismatch(example, f"{len(counts)} distinct numeric labels (e.g. {example!r}): "
                                 "scores rather than classes?",
                        "set task to regression to predict the number")
    return None


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


@dataclass(frozen=True)
class TaskKind:
    name: str
    # HF config.json problem_type; transformers picks the loss from it.
    problem_type: str
    # tasks.model.heads.HEADS key: the three sequence tasks share the family's sequence
    # head (num_labels outputs; one for regression); token classification will name its own.
    head: str
    # raw cell (str, or list from JSON) -> label value; raises LabelError.
    parse: Callable
    # label value -> the names it adds to the label vocabulary (and label_counts).
    names: Callable
    # label value -> the split's stratum (rows of a stratum are held out in proportion).
    stratum: Callable
    # (label value, name -> index) -> what a prepared row stores.
    prepare: Callable
    # Metrics promote's gate may use (higher is better), the first the default shown.
    gate_metrics: tuple[str, ...]
    # The training metric logged next to the loss (history.json, TensorBoard, stdout).
    train_metric: str
    # The SavedModel's outputs besides the inputs, for docs and the model card.
    serving_outputs: dict[str, str]
    # How the evaluation counts: "confusion" (a matrix), "label_counts" (per-label TP/FP/FN)
    # or "pairs" (every (label, prediction) gathered: Spearman needs ranks).
    eval_kind: str
    wired: bool = True  # False: accepted by the schema, refused by parse_config
    # Other metrics evaluate's manifest lists next to the gate metrics (lower is better).
    reported_metrics: tuple[str, ...] = ()
    split_rule: str = ""
    # Whether the outputs are named by the label vocabulary (regression: one output, named
    # after the label column), and whether a row's whole cell is one name (the readers then
    # check it against `labels` as it passes).
    names_labels: bool = True
    one_name_per_row: bool = True
    # (label counts, rows, delimiter) -> Mismatch or None: labels that say the file was
    # written for another task.
    check_labels: Callable = lambda counts, rows, delimiter: None
    # Labels per word piece ([batch, seq], IGNORED where a piece scores nothing) rather than
    # per row: the loss is a mean over labelled pieces, not over rows.
    per_token: bool = False
    # Whether training batches group rows by length when group_by_length is empty: only where
    # a side-by-side run showed it costs no quality (single-label classification,
    # benchmarks/RESULTS.md). On GoEmotions and WNUT17 length-grouped batches cost bertflow
    # 0.05 micro-F1 and 0.02-0.03 entity F1 against random ones (computed from the archived
    # quality_goemotions*.json and quality_wnut17*.json, benchmarks/results/archive/HISTORY.md);
    # regression is unmeasured and keeps the Trainer's random batches.
    groups_by_length: bool = False

    # --- TFRecord label feature -------------------------------------------------------------
    def label_spec(self, num_labels: int) -> dict:
        """The TFRecords' `label` feature: classification an int64 index; multi-label a float
        multi-hot vector of num_labels; regression a float list of one value (the model's
        [batch, 1] output shape)."""
        if self.name == "classification":
            return {"dtype": "int64", "shape": []}
        if self.per_token:  # one tag id per word piece: a variable-length list
            return {"dtype": "int64", "shape": [None], "per_token": True}
        return {"dtype": "float32", "shape": [num_labels if self.name == "multi_label" else 1]}

    def record_labels(self, values: list, num_labels: int) -> np.ndarray:
        """Prepared-row labels of a chunk -> the array tfrecord_io writes."""
        if self.name == "classification":
            return np.array(values, np.int64)
        if self.name == "regression":
            return np.array(values, np.float32).reshape(-1, 1)
        hot = np.zeros((len(values), num_labels), np.float32)
        for row, indices in enumerate(values):
            hot[row, indices] = 1.0
        return hot

    # --- training ------------------------------------------------------------------------
    def keras_loss(self, reduction=None, label_smoothing: float = 0.0,
                   class_weights: tuple[float, ...] | None = None,
                   pieces_per_row: float | None = None):
        """The loss as a Keras loss object (per example with reduction NONE): sparse softmax
        cross-entropy (against smoothed labels with `label_smoothing`, each example weighted
        by its class's `class_weights`); per-label sigmoid cross-entropy averaged over labels
        (BCEWithLogits' mean over labels and examples, as every row has num_labels terms;
        `class_weights` are the labels' pos_weight); squared error. Per token: over the
        labelled pieces, divided by `pieces_per_row` per row when set, else by the batch's
        labelled pieces."""
        import tf_keras

        kwargs = {} if reduction is None else {"reduction": reduction}
        if self.per_token:
            return _token_keras_loss(label_smoothing, class_weights, pieces_per_row,
                                     **kwargs)
        if self.name == "classification" and (label_smoothing or class_weights):
            return _smoothed_keras_loss(label_smoothing, class_weights, **kwargs)
        if self.name == "classification":
            return tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True, **kwargs)
        if self.name == "multi_label" and class_weights:
            return _pos_weighted_keras_loss(class_weights, **kwargs)
        if self.name == "multi_label":
            return tf_keras.losses.BinaryCrossentropy(from_logits=True, **kwargs)
        return tf_keras.losses.MeanSquaredError(**kwargs)

    def keras_metric(self):
        import tf_keras

        if self.per_token:
            return _token_keras_accuracy(self.train_metric)
        if self.name == "classification":
            return tf_keras.metrics.SparseCategoricalAccuracy(self.train_metric)
        if self.name == "multi_label":  # logits > 0 is probability > 0.5
            return tf_keras.metrics.BinaryAccuracy(self.train_metric, threshold=0.0)
        return tf_keras.metrics.MeanSquaredError(self.train_metric)

    def metric_sum(self, labels, logits):
        """Sum over the batch's rows of the per-row training metric (the custom loop divides
        by the global batch): correct rows; the fraction of a row's labels right; squared
        error. Per token: the correct labelled pieces (divided by the labelled pieces)."""
        import tensorflow as tf

        if self.per_token:
            labelled = tf.not_equal(labels, IGNORED)
            right = tf.equal(tf.argmax(logits, -1, output_type=labels.dtype), labels)
            return tf.reduce_sum(tf.cast(right & labelled, tf.float32))
        if self.name == "classification":
            predicted = tf.argmax(logits, -1, output_type=tf.int32)
            return tf.reduce_sum(tf.cast(tf.equal(predicted, labels), tf.float32))
        if self.name == "multi_label":
            right = tf.equal(tf.cast(logits > 0, tf.float32), labels)
            return tf.reduce_sum(tf.reduce_mean(tf.cast(right, tf.float32), -1))
        return tf.reduce_sum(tf.square(logits - labels))

    # --- serving ----------------------------------------------------------------------------
    def serving_outputs_of(self, logits, label_names, threshold=0.5) -> dict:
        """The serving signature's outputs. `threshold`: multi-label, one for every label or
        one per label (tuned); classification, None (argmax) or a binary decision
        threshold on the second label's probability (tasks/thresholds.py)."""
        import tensorflow as tf

        if self.name == "classification":
            probabilities = tf.nn.softmax(logits, axis=-1)
            chosen = tf.argmax(probabilities, axis=-1)
            if threshold is not None:
                bound = tf.constant(threshold, probabilities.dtype)
                chosen = tf.cast(probabilities[:, 1] > bound, tf.int64)
            return {"probabilities": probabilities, "label": tf.gather(label_names, chosen)}
        if self.name == "multi_label":
            probabilities = tf.sigmoid(logits)
            # The names over the threshold, in label order, first in the row and padded with
            # "" to [batch, num_labels]: a signature's outputs must be dense tensors.
            over = probabilities > tf.constant(threshold, probabilities.dtype)
            names = tf.ragged.boolean_mask(
                tf.broadcast_to(label_names, tf.shape(logits)), over)
            return {"probabilities": probabilities,
                    "labels": names.to_tensor(default_value="",
                                              shape=[None, logits.shape[-1]])}
        return {"score": logits[:, 0]}


def _first(values):
    return values[0]


KINDS: dict[str, TaskKind] = {
    "classification": TaskKind(
        name="classification", problem_type="single_label_classification",
        head="sequence_classification", parse=_class_label, names=lambda v: [v],
        stratum=lambda v: v, prepare=lambda v, index: index[v],
        gate_metrics=("accuracy", "macro_f1"), train_metric="accuracy",
        serving_outputs={"probabilities": "float32 [batch, num_labels] (softmax)",
                         "label": "tf.string [batch] (the most probable label; two "
                                  "labels with decision_threshold: the second where its "
                                  "probability is over it)"},
        eval_kind="confusion", check_labels=_check_class_labels, groups_by_length=True,
        split_rule="per class exactly min(n-1, max(1, round(n*eval_fraction))) rows, "
                   "chosen by selection sampling on a seeded hash of each row"),
    "multi_label": TaskKind(
        name="multi_label", problem_type="multi_label_classification",
        head="sequence_classification", parse=_multi_label, names=lambda v: v,
        stratum=_first, prepare=lambda v, index: [index[n] for n in v],
        gate_metrics=("micro_f1", "macro_f1", "subset_accuracy"),
        train_metric="label_accuracy",
        serving_outputs={"probabilities": "float32 [batch, num_labels] (sigmoid)",
                         "labels": "tf.string [batch, num_labels]: the labels whose "
                                   "probability is over multi_label_threshold (tuned: "
                                   "its own), in label order, then \"\" padding"},
        eval_kind="label_counts", one_name_per_row=False,
        split_rule="stratified by each row's first label: per first label exactly "
                   "min(n-1, max(1, round(n*eval_fraction))) rows, chosen by selection "
                   "sampling on a seeded hash of each row"),
    "regression": TaskKind(
        name="regression", problem_type="regression", head="sequence_classification",
        parse=_score, names=lambda v: [], stratum=lambda v: "",
        prepare=lambda v, index: v, gate_metrics=("pearson", "spearman"),
        train_metric="mse",
        serving_outputs={"score": "float32 [batch]"}, eval_kind="pairs",
        reported_metrics=("mse",),
        names_labels=False, one_name_per_row=False,
        split_rule="plain seeded: exactly round(n*eval_fraction) rows, chosen by selection "
                   "sampling on a seeded hash of each row"),
    # Sentences of tagged words: read by tasks/steps/token_data.py (so parse, names, stratum
    # and prepare are not used), one tag id per word piece (tasks/model/token_encoding.py).
    "token_classification": TaskKind(
        name="token_classification", problem_type="token_classification",
        head="token_classification", parse=_class_label, names=lambda v: [v],
        stratum=lambda v: "", prepare=lambda v, index: index[v],
        gate_metrics=("f1", "macro_f1"), reported_metrics=("precision", "recall"),
        train_metric="accuracy",
        serving_outputs={
            "num_entities": "int64 [batch]: how many entities each text has",
            "entity_group": "tf.string [batch, max entities]: each entity's type (\"\" "
                            "padding)",
            "start": "int64 [batch, max entities]: character offset of its first "
                     "character (-1 padding)",
            "end": "int64 [batch, max entities]: character offset after its last (-1 "
                   "padding)",
            "word": "tf.string [batch, max entities]: the text from start to end",
            "score": "float32 [batch, max entities]: the mean of its words' probabilities"},
        eval_kind="entities", one_name_per_row=False, per_token=True,
        split_rule="by sentence: exactly min(n-1, max(1, round(n*eval_fraction))) "
                   "sentences, chosen by selection sampling on a seeded hash of each "
                   "sentence"),
}
GATE_METRICS = tuple(dict.fromkeys(m for kind in KINDS.values() for m in kind.gate_metrics))


def kind(task: str) -> TaskKind:
    return KINDS[task]


# --- token classification's training loss and metric, for Keras' fit -------------------------
def smoothed_cross_entropy(labels, logits, label_smoothing: float = 0.0,
                           class_weights: tuple[float, ...] | None = None):
    """Softmax cross-entropy of each row against (1 - s) x one-hot(label) + s / classes, in
    float32: (1 - s) x NLL + s x the mean over classes of -log p, transformers'
    LabelSmoother; times the row's class weight when `class_weights` are given (one per
    class: tasks/training/class_weights.py). labels: int [...]; logits: [..., classes];
    s = 0 and no weights is the plain loss."""
    import tensorflow as tf

    logits = tf.cast(logits, tf.float32)
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    if label_smoothing:
        uniform = -tf.reduce_mean(tf.nn.log_softmax(logits), axis=-1)
        losses = (1.0 - label_smoothing) * losses + label_smoothing * uniform
    if class_weights:
        losses *= tf.gather(tf.constant(class_weights, tf.float32), labels)
    return losses


def masked_token_losses(labels, logits, label_smoothing: float = 0.0,
                        class_weights: tuple[float, ...] | None = None):
    """(softmax cross-entropy summed over each row's labelled pieces, float32 [batch]; the
    row's labelled pieces, float32 [batch]). labels: int [batch, seq], IGNORED where a piece
    scores nothing (padding included); logits: [batch, seq, num_labels], any float dtype.
    With `label_smoothing` and `class_weights`, as smoothed_cross_entropy takes them (the
    count stays the labelled pieces')."""
    import tensorflow as tf

    labelled = tf.not_equal(labels, IGNORED)
    losses = smoothed_cross_entropy(tf.where(labelled, labels, tf.zeros_like(labels)),
                                    logits, label_smoothing, class_weights)
    weights = tf.cast(labelled, tf.float32)
    return tf.reduce_sum(losses * weights, axis=1), tf.reduce_sum(weights, axis=1)


def _smoothed_keras_loss(label_smoothing: float, class_weights=None, **kwargs):
    """Single-label classification's loss against smoothed labels and/or weighted by class,
    per example."""
    import tensorflow as tf
    import tf_keras

    class SmoothedCrossEntropy(tf_keras.losses.Loss):
        def call(self, y_true, y_pred):
            labels = tf.reshape(tf.cast(y_true, tf.int64), tf.shape(y_pred)[:-1])
            return smoothed_cross_entropy(labels, y_pred, label_smoothing, class_weights)

    return SmoothedCrossEntropy(name="smoothed_cross_entropy", **kwargs)


def _pos_weighted_keras_loss(pos_weight: tuple[float, ...], **kwargs):
    """Multi-label's per-label sigmoid cross-entropy with each label's positives weighted
    (torch's BCEWithLogitsLoss(pos_weight=)), averaged over labels, per example."""
    import tensorflow as tf
    import tf_keras

    class PosWeightedCrossEntropy(tf_keras.losses.Loss):
        def call(self, y_true, y_pred):
            return tf.reduce_mean(tf.nn.weighted_cross_entropy_with_logits(
                labels=tf.cast(y_true, tf.float32), logits=tf.cast(y_pred, tf.float32),
                pos_weight=tf.constant(pos_weight, tf.float32)), axis=-1)

    return PosWeightedCrossEntropy(name="pos_weighted_cross_entropy", **kwargs)


def _token_keras_loss(label_smoothing: float = 0.0, class_weights=None,
                      pieces_per_row: float | None = None, **kwargs):
    """A Keras loss whose batch mean (Keras' default reduction) is the mean over the batch's
    labelled pieces, as transformers' CrossEntropyLoss(ignore_index=-100) takes it: each row
    reports its pieces' loss sum scaled by rows / labelled pieces of the batch. Under a
    distribution strategy that is each replica's mean, averaged over replicas (the custom
    loop takes the exact mean over the global batch: tasks/training/token_loss.py).
    `pieces_per_row` (loss_normalizer dataset): each row's sum divided by that fixed
    count instead, whatever the batch's pieces."""
    import tensorflow as tf
    import tf_keras

    class TokenCrossEntropy(tf_keras.losses.Loss):
        def call(self, y_true, y_pred):
            sums, counts = masked_token_losses(y_true, y_pred, label_smoothing,
                                               class_weights)
            if pieces_per_row is not None:
                return sums / pieces_per_row
            rows = tf.cast(tf.shape(sums)[0], tf.float32)
            return sums * rows / tf.maximum(tf.reduce_sum(counts), 1.0)

    return TokenCrossEntropy(name="token_cross_entropy", **kwargs)


def _token_keras_accuracy(name: str):
    """The share of labelled pieces whose most probable tag is right."""
    import tensorflow as tf
    import tf_keras

    class TokenAccuracy(tf_keras.metrics.Metric):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.right = self.add_weight("right", initializer="zeros")
            self.labelled = self.add_weight("labelled", initializer="zeros")

        def update_state(self, y_true, y_pred, sample_weight=None):
            y_true = tf.cast(y_true, tf.int64)
            labelled = tf.not_equal(y_true, IGNORED)
            right = tf.equal(tf.argmax(y_pred, -1), y_true) & labelled
            self.right.assign_add(tf.reduce_sum(tf.cast(right, tf.float32)))
            self.labelled.assign_add(tf.reduce_sum(tf.cast(labelled, tf.float32)))

        def result(self):
            return tf.math.divide_no_nan(self.right, self.labelled)

        def reset_state(self):
            self.right.assign(0.0)
            self.labelled.assign(0.0)

    return TokenAccuracy(name=name)


# --- evaluation ------------------------------------------------------------------------------
def classification_metrics(matrix, labels: list[str]) -> dict:
    """Accuracy, macro-F1 and per-class precision/recall/F1/support from a confusion matrix
    (rows: true label, columns: predicted). A ratio with a zero denominator counts as 0."""
    matrix = np.asarray(matrix, dtype=np.int64)
    correct = np.diag(matrix).astype(float)
    support = matrix.sum(axis=1)
    predicted = matrix.sum(axis=0)
    precision = ratio(correct, predicted)
    recall = ratio(correct, support)
    f1 = ratio(2 * precision * recall, precision + recall)
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


def multi_label_metrics(counts, labels: list[str], threshold: float) -> dict:
    """From summed counts: tp, fp, fn per label [3, L] and (exact rows, rows)."""
    tp, fp, fn = (np.asarray(x, np.float64) for x in counts["per_label"])
    exact, rows = counts["exact"], counts["rows"]
    precision, recall = ratio(tp, tp + fp), ratio(tp, tp + fn)
    f1 = ratio(2 * precision * recall, precision + recall)
    micro_p, micro_r = ratio(tp.sum(), tp.sum() + fp.sum()), ratio(tp.sum(), tp.sum() + fn.sum())
    return {
        "micro_f1": float(ratio(2 * micro_p * micro_r, micro_p + micro_r)),
        "macro_f1": float(f1.mean()),
        "subset_accuracy": float(exact / rows) if rows else 0.0,
        "threshold": threshold,
        "per_label": {label: {"precision": float(precision[i]), "recall": float(recall[i]),
                              "f1": float(f1[i]), "support": int(tp[i] + fn[i])}
                      for i, label in enumerate(labels)},
        "labels": list(labels), "num_examples": int(rows)}


def regression_metrics(truth, predicted) -> dict:
    """MSE, Pearson and Spearman (Pearson of average ranks, ties shared, as scipy's) over
    every evaluation pair, in float64; plus a binned predicted-vs-true summary the model
    card and the run page draw."""
    truth, predicted = np.asarray(truth, np.float64), np.asarray(predicted, np.float64)
    return {"mse": float(np.mean((predicted - truth) ** 2)) if len(truth) else 0.0,
            "pearson": pearson(truth, predicted),
            "spearman": pearson(average_ranks(truth), average_ranks(predicted)),
            "num_examples": int(len(truth)),
            "binned": binned(truth, predicted)}


def binned(truth, predicted, bins: int = 10) -> dict:
    """Equal-width bins of the true value: per bin its row count and the mean and range of
    the predictions (a small predicted-against-true table; also what the run page plots)."""
    if not len(truth):
        return {"edges": [], "rows": []}
    edges = np.linspace(truth.min(), truth.max(), bins + 1)
    which = np.clip(np.searchsorted(edges, truth, side="right") - 1, 0, bins - 1)
    rows = []
    for b in range(bins):
        p = predicted[which == b]
        rows.append({"low": float(edges[b]), "high": float(edges[b + 1]), "count": int(len(p)),
                     "mean_true": float(truth[which == b].mean()) if len(p) else None,
                     "mean_predicted": float(p.mean()) if len(p) else None})
    return {"edges": edges.tolist(), "rows": rows}


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    if len(x) < 2:
        return 0.0
    x, y = x - x.mean(), y - y.mean()
    denominator = math.sqrt(float((x * x).sum() * (y * y).sum()))
    return float((x * y).sum() / denominator) if denominator else 0.0


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing their average rank."""
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_values)) + 1]
    ends = np.r_[starts[1:], len(values)]
    ranks = np.empty(len(values), np.float64)
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return ranks


def ratio(numerator, denominator):
    """numerator / denominator elementwise in float64; 0 where the denominator is 0."""
    numerator = np.asarray(numerator, np.float64)
    denominator = np.asarray(denominator, np.float64)
    out = np.zeros_like(numerator)
    np.divide(numerator, denominator, out=out, where=denominator > 0)
    return out

