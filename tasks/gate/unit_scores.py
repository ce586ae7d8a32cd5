"""One model's served predictions on the test units, as the gate's metrics see them.

The gate scores the candidate and the champion on the same test units: a row, or a sentence
for entities (tasks/steps/gate_eval.py). `UnitScores` keeps, per unit, what the task's
metrics are made of (a row's right or wrong label, its labels' hits and misses, a sentence's
entity counts, a pair of scores), and computes any gate metric from a vector of unit
weights. Weights of ones give the metric on the test set as it is; a bootstrap resample is a
vector of multiplicities (tasks/gate/bootstrap.py), the same for both models.

The metrics follow the evaluate step's definitions (tasks/task_kinds.py,
tasks/training/entity_metrics.py): a ratio with nothing to divide by is 0; macro-F1 over
entity types counts the types with a true or a predicted entity.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from tasks.task_kinds import average_ranks, pearson, ratio
from tasks.training.entity_metrics import chunks, entity_types


@dataclass
class UnitScores:
    """The task's per-unit statistics of one model. `names`: the classes, labels or entity
    types that the per-class columns stand for."""

    task: str
    names: list[str]
    # classification: [units, 3, classes] (true positive, predicted, true) and [units]
    # correct; multi_label: [units, 3, labels] (tp, fp, fn) and [units] exact rows;
    # token_classification: [units, 3, types] (true, predicted, correct); regression: none.
    counts: np.ndarray = field(default_factory=lambda: np.zeros((0, 3, 0)))
    exact: np.ndarray = field(default_factory=lambda: np.zeros(0))
    truth: np.ndarray = field(default_factory=lambda: np.zeros(0))  # regression
    predicted: np.ndarray = field(default_factory=lambda: np.zeros(0))  # regression

    @property
    def units(self) -> int:
        return len(self.truth) if self.task == "regression" else len(self.exact)

    def metric(self, name: str, weights: np.ndarray | None = None) -> float:
        """The gate metric `name` with each unit counted `weights[i]` times (None: once)."""
        w = np.ones(self.units) if weights is None else np.asarray(weights, np.float64)
        if self.task == "regression":
            return _regression_metric(name, self.truth, self.predicted, w)
        summed = np.tensordot(w, self.counts, axes=1)  # [3, names]
        rows = w.sum()
        if self.task == "classification":
            tp, predicted, true = summed
            if name == "accuracy":
                return float(w @ self.exact / rows) if rows else 0.0
            if name == "macro_f1":
                return float(ratio(2 * tp, predicted + true).mean())
        elif self.task == "multi_label":
            tp, fp, fn = summed
            if name == "micro_f1":
                return float(ratio(2 * tp.sum(), 2 * tp.sum() + fp.sum() + fn.sum()))
            if name == "macro_f1":
                return float(ratio(2 * tp, 2 * tp + fp + fn).mean())
            if name == "subset_accuracy":
                return float(w @ self.exact / rows) if rows else 0.0
        elif self.task == "token_classification":
            true, predicted, correct = summed
            if name == "f1":
                return float(ratio(2 * correct.sum(), true.sum() + predicted.sum()))
            if name == "precision":
                return float(ratio(correct.sum(), predicted.sum()))
            if name == "recall":
                return float(ratio(correct.sum(), true.sum()))
            if name == "macro_f1":
                present = (true + predicted) > 0
                f1 = ratio(2 * correct, true + predicted)
                return float(f1[present].mean()) if present.any() else 0.0
        raise KeyError(f"{name} is not a {self.task} metric")

    def per_class_f1(self) -> dict[str, dict]:
        """{class, label or entity type: {"f1", "support"}} on the whole test set."""
        if self.task == "regression":
            return {}
        a, b, c = self.counts.sum(axis=0)
        if self.task == "classification":  # tp, predicted, true
            f1, support = ratio(2 * a, b + c), c
        elif self.task == "multi_label":  # tp, fp, fn
            f1, support = ratio(2 * a, 2 * a + b + c), a + c
        else:  # true, predicted, correct
            f1, support = ratio(2 * c, a + b), a
        return {name: {"f1": float(f1[i]), "support": int(support[i])}
                for i, name in enumerate(self.names)}


def classification(truth: np.ndarray, predicted: np.ndarray, labels: list[str]) -> UnitScores:
    """Rows' true and predicted class indices (into `labels`)."""
    truth, predicted = np.asarray(truth, np.int64), np.asarray(predicted, np.int64)
    eye = np.eye(len(labels))
    correct = (truth == predicted).astype(np.float64)
    counts = np.stack([eye[truth] * correct[:, None], eye[predicted], eye[truth]], axis=1)
    return UnitScores("classification", list(labels), counts=counts, exact=correct)


def multi_label(truth: np.ndarray, predicted: np.ndarray, labels: list[str]) -> UnitScores:
    """Rows' true and predicted label sets as booleans [rows, labels]."""
    truth, predicted = np.asarray(truth, bool), np.asarray(predicted, bool)
    counts = np.stack([truth & predicted, predicted & ~truth, truth & ~predicted],
                      axis=1).astype(np.float64)
    exact = (truth == predicted).all(axis=1).astype(np.float64)
    return UnitScores("multi_label", list(labels), counts=counts, exact=exact)


def regression(truth: np.ndarray, predicted: np.ndarray) -> UnitScores:
    return UnitScores("regression", [], truth=np.asarray(truth, np.float64),
                      predicted=np.asarray(predicted, np.float64))


def entities(true_tags: list[list[str]], predicted: list[set[tuple[str, int, int]]],
             tag_names: list[str]) -> UnitScores:
    """Sentences' true BIO tags and predicted entities (type, first word, end word), each
    sentence a unit; chunks as conlleval reads the tags (tasks/training/entity_metrics.py)."""
    types = entity_types(tag_names)
    row = {kind: i for i, kind in enumerate(types)}
    counts = np.zeros((len(true_tags), 3, len(types)))
    for unit, (tags, found) in enumerate(zip(true_tags, predicted, strict=True)):
        true_chunks = set(chunks(tags))
        for column, spans in enumerate((true_chunks, found, true_chunks & found)):
            for kind, _, _ in spans:
                counts[unit, column, row[kind]] += 1
    return UnitScores("token_classification", types, counts=counts,
                      exact=np.zeros(len(true_tags)))


def word_spans(words: list[str], starts: list[int], ends: list[int],
               kinds: list[str]) -> set[tuple[str, int, int]]:
    """Served entities (type, character start, character end) of `" ".join(words)` as
    (type, first word, end word exclusive): the words their characters fall in."""
    word_starts, offset = [], 0
    for word in words:
        word_starts.append(offset)
        offset += len(word) + 1
    spans = set()
    for kind, start, end in zip(kinds, starts, ends):
        first = bisect.bisect_right(word_starts, start) - 1
        last = bisect.bisect_right(word_starts, max(start, end - 1)) - 1
        spans.add((kind, first, last + 1))
    return spans


def _regression_metric(name: str, truth: np.ndarray, predicted: np.ndarray,
                       weights: np.ndarray) -> float:
    if name == "mse":
        rows = weights.sum()
        return float(weights @ (predicted - truth) ** 2 / rows) if rows else 0.0
    # Pearson and Spearman over the resample as drawn: each row as often as its weight.
    index = np.repeat(np.arange(len(truth)), np.rint(weights).astype(np.int64))
    x, y = truth[index], predicted[index]
    if name == "pearson":
        return pearson(x, y)
    if name == "spearman":
        return pearson(average_ranks(x), average_ranks(y))
    raise KeyError(f"{name} is not a regression metric")
