"""One model's served predictions on the test units, as the gate's metrics see them.

The gate scores the candidate and the champion on the same test units: a row, or a sentence
for entities (tasks/steps/gate_eval.py). `UnitScores` keeps, per unit, what the task's
metrics are made of (a row's true and predicted class, its labels' hits and misses, a
sentence's entity counts, a pair of scores) and reports the evaluate step's own metrics
(tasks/task_kinds.py, tasks/training/entity_metrics.py) with each unit counted as often as a
vector of weights says. Weights of ones give the test set as it is; a bootstrap resample is
a vector of multiplicities (tasks/gate/bootstrap.py), the same for both models.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from tasks.task_kinds import classification_metrics, multi_label_metrics, regression_metrics
from tasks.training.entity_metrics import add_chunk_counts, chunks, entity_scores, entity_types

# Where each task's report keeps its per-class figures.
PER_CLASS = {"classification": "per_class", "multi_label": "per_label",
             "token_classification": "per_type"}


@dataclass
class UnitScores:
    """The task's per-unit statistics of one model. `names`: the classes, labels or entity
    types that the per-class figures stand for."""

    task: str
    names: list[str]
    units: int
    # classification: true and predicted class; regression: true and predicted score.
    truth: np.ndarray = field(default_factory=lambda: np.zeros(0))
    predicted: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # multi_label: [units, 3, labels] (tp, fp, fn) and [units] exact rows;
    # token_classification: [units, types, 3] (true, predicted, correct entities).
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0))
    exact: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def report(self, weights: np.ndarray | None = None) -> dict:
        """The evaluate step's metrics with each unit counted `weights[i]` times (None:
        once)."""
        w = np.ones(self.units) if weights is None else np.asarray(weights, np.float64)
        if self.task == "classification":
            n = len(self.names)
            matrix = np.bincount(self.truth * n + self.predicted, weights=w, minlength=n * n)
            return classification_metrics(matrix.reshape(n, n), self.names)
        if self.task == "multi_label":
            return multi_label_metrics({"per_label": np.tensordot(w, self.counts, axes=1),
                                        "exact": w @ self.exact, "rows": w.sum()},
                                       self.names, threshold=None)
        if self.task == "token_classification":
            return entity_scores(np.tensordot(w, self.counts, axes=1), self.names)
        # Correlations need the rows themselves: each as often as its weight.
        index = np.repeat(np.arange(self.units), np.rint(w).astype(np.int64))
        return regression_metrics(self.truth[index], self.predicted[index])

    def metric(self, name: str, weights: np.ndarray | None = None) -> float:
        """The gate metric `name` with each unit counted `weights[i]` times (None: once)."""
        return float(self.report(weights)[name])

    def per_class_f1(self, report: dict | None = None) -> dict[str, dict]:
        """{class, label or entity type: {"f1", "support"}} of `report` (default: the
        whole test set's)."""
        if self.task not in PER_CLASS:
            return {}
        report = report or self.report()
        return {name: {"f1": m["f1"], "support": m["support"]}
                for name, m in report[PER_CLASS[self.task]].items()}


def classification(truth, predicted, labels: list[str]) -> UnitScores:
    """Rows' true and predicted class indices (into `labels`)."""
    truth, predicted = np.asarray(truth, np.int64), np.asarray(predicted, np.int64)
    return UnitScores("classification", list(labels), len(truth), truth, predicted)


def multi_label(truth, predicted, labels: list[str]) -> UnitScores:
    """Rows' true and predicted label sets as booleans [rows, labels]."""
    truth, predicted = np.asarray(truth, bool), np.asarray(predicted, bool)
    counts = np.stack([truth & predicted, predicted & ~truth, truth & ~predicted],
                      axis=1).astype(np.float64)
    exact = (truth == predicted).all(axis=1).astype(np.float64)
    return UnitScores("multi_label", list(labels), len(truth), counts=counts, exact=exact)


def regression(truth, predicted) -> UnitScores:
    truth = np.asarray(truth, np.float64)
    return UnitScores("regression", [], len(truth), truth, np.asarray(predicted, np.float64))


def entities(true_tags: list[list[str]], predicted: list[set[tuple[str, int, int]]],
             tag_names: list[str]) -> UnitScores:
    """Sentences' true BIO tags and predicted entities (type, first word, end word), each
    sentence a unit; chunks as conlleval reads the tags (tasks/training/entity_metrics.py)."""
    types = entity_types(tag_names)
    row = {kind: i for i, kind in enumerate(types)}
    counts = np.zeros((len(true_tags), len(types), 3))
    for unit, (tags, found) in enumerate(zip(true_tags, predicted, strict=True)):
        add_chunk_counts(counts[unit], set(chunks(tags)), found, row)
    return UnitScores("token_classification", types, len(true_tags), counts=counts)


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
