"""Thresholds tuned on the validation rows (issue 48): `multi_label_threshold: tuned` and,
for binary classification, `decision_threshold: tuned`.

The train step counts, in one pass over the validation split with the exported weights, for
every threshold t of GRID and every label: the rows predicted positive (probability > t),
the true positives among them, the label's positives and the rows (tasks/steps/evaluate.py,
threshold_counts). `choose` then takes, per label, the t of GRID with the best validation
metric (F1 of that label; for binary classification the chosen decision_threshold_metric),
ties going to the t nearest FALLBACK. A label with fewer than MIN_POSITIVES positives in the
validation rows keeps FALLBACK: its F1 would move by one or two rows. The test rows are never
read to choose.

Binary classification thresholds the probability of the second label in label order (the
positive class, as scikit-learn's pos_label=1 with sorted labels): it is predicted when that
probability is over the threshold, the first label otherwise. 0.5 is argmax.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

TUNED = "tuned"
# 0.05 to 0.95 by 0.01: 91 thresholds, FALLBACK among them.
GRID = tuple(round(k / 100, 2) for k in range(5, 96))
FALLBACK = 0.5
# A label with fewer validation positives than this keeps FALLBACK.
MIN_POSITIVES = 10
# decision_threshold_metric's choices (binary classification).
BINARY_METRICS = ("f1", "accuracy", "macro_f1")


def _ratio(numerator, denominator):
    numerator, denominator = (np.asarray(x, np.float64) for x in (numerator, denominator))
    out = np.zeros(np.broadcast(numerator, denominator).shape)
    np.divide(numerator, denominator, out=out, where=denominator > 0)
    return out


def scores(metric: str, tp, fp, fn, tn):
    """The metric per (label, threshold) from the counts (F1 of the positive class;
    accuracy; macro-F1 of the two classes)."""
    f1 = _ratio(2 * tp, 2 * tp + fp + fn)
    if metric == "f1":
        return f1
    if metric == "accuracy":
        return _ratio(tp + tn, tp + fp + fn + tn)
    if metric == "macro_f1":
        return (f1 + _ratio(2 * tn, 2 * tn + fn + fp)) / 2
    raise ValueError(f"unknown threshold metric {metric!r}")


def choose(counts, names: list[str], metric: str = "f1", param: str = "multi_label_threshold",
           grid: tuple = GRID, min_positives: int = MIN_POSITIVES,
           fallback: float = FALLBACK) -> dict:
    """The train manifest's `thresholds` record from `counts`, threshold_counts' int vector
    [2 x labels x grid + labels + 1]: true positives [labels, grid], predicted positives
    [labels, grid], positives [labels], rows."""
    counts = np.asarray(counts, np.int64)
    labels, size = len(names), len(grid)
    tp = counts[:labels * size].reshape(labels, size)
    predicted = counts[labels * size:2 * labels * size].reshape(labels, size)
    positives = counts[2 * labels * size:2 * labels * size + labels]
    rows = int(counts[-1])
    fp, fn = predicted - tp, positives[:, None] - tp
    table = scores(metric, tp, fp, fn, rows - tp - fp - fn)
    distance = np.abs(np.asarray(grid) - fallback)
    at_fallback = int(np.argmin(distance))
    per_label = {}
    for i, name in enumerate(names):
        rare = int(positives[i]) < min_positives
        best = table[i].max()
        # Among the best, the nearest to the fallback (the first of two as near).
        pick = at_fallback if rare else int(np.argmin(
            np.where(table[i] >= best - 1e-12, distance, np.inf)))
        per_label[name] = {"threshold": fallback if rare else grid[pick],
                           f"validation_{metric}": round(float(table[i, pick]), 6),
                           "positives": int(positives[i]), "fallback": rare}
    return {"param": param, "setting": TUNED, "metric": metric, "split": "validation",
            "validation_rows": rows,
            "grid": {"low": grid[0], "high": grid[-1], "step": round(grid[1] - grid[0], 6)},
            "min_positives": min_positives, "fallback_threshold": fallback,
            "per_label": per_label,
            "thresholds": [entry["threshold"] for entry in per_label.values()]}


def for_evaluation(cfg, task: str, record: Optional[dict]):
    """The threshold evaluation and serving apply: multi-label, the tuned vector (one per
    label, from the train manifest's `record`) or multi_label_threshold; classification,
    the binary decision threshold, or None for argmax (decision_threshold 0.5)."""
    if task == "multi_label":
        if cfg.multi_label_threshold == TUNED:
            return _recorded(record, "multi_label_threshold")
        return cfg.multi_label_threshold
    if task == "classification" and cfg.decision_threshold != FALLBACK:
        if cfg.decision_threshold == TUNED:
            return _recorded(record, "decision_threshold")[0]
        return cfg.decision_threshold
    return None


def during_training(cfg, task: str):
    """The threshold of the validation evaluations during training, before any is tuned:
    FALLBACK where the setting is tuned."""
    if task == "multi_label":
        return FALLBACK if cfg.multi_label_threshold == TUNED else cfg.multi_label_threshold
    if task == "classification" and cfg.decision_threshold not in (TUNED, FALLBACK):
        return cfg.decision_threshold
    return None


def _recorded(record: Optional[dict], param: str) -> list[float]:
    if not record or record.get("param") != param:
        from tasks.errors import ConfigError

        raise ConfigError(param, "tuned, but the train step recorded no tuned thresholds: "
                                 "run the train step again with this config")
    return list(record["thresholds"])


def tuned_param(cfg) -> Optional[str]:
    """The Param whose thresholds this run tunes, if any."""
    if cfg.task == "multi_label" and cfg.multi_label_threshold == TUNED:
        return "multi_label_threshold"
    if cfg.task == "classification" and cfg.decision_threshold == TUNED:
        return "decision_threshold"
    return None
