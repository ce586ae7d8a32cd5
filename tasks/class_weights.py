"""`class_weights`: how much each label's examples count in the loss (issue 48).

- `none`: every example counts once.
- `balanced`: from the training split's label counts (the data manifest's `label_counts`),
  scikit-learn's rule: a class's weight is examples / (classes x its examples), so each class
  contributes equally in total. Classification counts rows, token classification counts
  labelled words. For multi-label it is each label's `pos_weight`, torch's
  BCEWithLogitsLoss convention: negatives / positives of that label.
- a JSON object from label name to weight (`{"refund": 3, "other": 1}`): every label of the
  data, each once, each weight positive.

The weighted loss is normalised as the unweighted one is (by the batch's examples, or its
labelled pieces), as Keras' `class_weight` does; torch's `CrossEntropyLoss(weight=)` divides
by the batch's summed weights instead. With balanced weights the two agree on average over
the data (the mean weight of an example is 1).
"""
from __future__ import annotations

import json
from typing import Optional

from tasks.errors import ConfigError

FIELD = "class_weights"


def parse_map(spec: str) -> Optional[dict[str, float]]:
    """The label -> weight map of a JSON `spec`; None for `none` and `balanced`. ConfigError
    on anything else, before any data is read."""
    if spec in ("none", "balanced"):
        return None
    try:
        weights = json.loads(spec)
    except ValueError:
        weights = None
    if not isinstance(weights, dict) or not weights:
        raise ConfigError(FIELD, f"{spec!r} is not none, balanced or a JSON object from label "
                                 'name to weight, e.g. {"refund": 3, "other": 1}')
    bad = [name for name, w in weights.items()
           if isinstance(w, bool) or not isinstance(w, (int, float)) or not w > 0]
    if bad:
        raise ConfigError(FIELD, f"the weights of {bad} are not positive numbers")
    return {name: float(w) for name, w in weights.items()}


def check_labels(spec: str, labels: list[str], where: str) -> None:
    """A map must name exactly the data's labels; raises naming the strays and the missing."""
    weights = parse_map(spec)
    if weights is None:
        return
    stray = [name for name in weights if name not in labels]
    missing = [name for name in labels if name not in weights]
    if stray or missing:
        raise ConfigError(FIELD, "; ".join(part for part in (
            f"names {stray}, not labels of {where}" if stray else "",
            f"has no weight for {missing}" if missing else "") if part)
            + f"; the labels are {labels}")


def for_run(spec: str, task: str, labels: list[str], train_split: dict
            ) -> Optional[tuple[float, ...]]:
    """One weight per label in output order, or None for `none`. `train_split`: the data
    manifest's train split (`num_examples`, `label_counts`)."""
    if spec == "none":
        return None
    check_labels(spec, labels, "the training data")
    weights = parse_map(spec)
    if weights is not None:
        return tuple(weights[name] for name in labels)
    counts = [train_split["label_counts"].get(name, 0) for name in labels]
    if task == "multi_label":  # pos_weight: negatives / positives
        rows = train_split["num_examples"]
        return tuple((rows - c) / c if c else 1.0 for c in counts)
    total = sum(counts)
    return tuple(total / (len(labels) * c) if c else 1.0 for c in counts)
