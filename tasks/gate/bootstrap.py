"""A paired bootstrap of the metric difference between two models on the same test units.

Both models predicted the same units (rows, or sentences for entities). Each resample draws
the units with replacement, the same draw for both models, and recomputes both metrics; the
differences' 2.5th and 97.5th percentiles give the 95% interval (Efron and Tibshirani's
percentile interval; the paired design of Koehn 2004 and Berg-Kirkpatrick et al. 2012 for
comparing two systems on one test set). A resample is a vector of multiplicities, so a
metric that sums per-unit counts costs one weighted sum per resample.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from tasks.gate.unit_scores import UnitScores

SAMPLES = 1000
CONFIDENCE = 0.95


@dataclass(frozen=True)
class PairedDifference:
    metric: str
    candidate: float  # the metric on the test units as they are
    champion: float
    difference: float  # candidate - champion
    low: float  # the interval of the difference
    high: float
    units: int
    samples: int
    confidence: float
    seed: int

    def as_dict(self) -> dict:
        return asdict(self)


def resample_weights(units: int, samples: int, seed: int):
    """`samples` vectors of multiplicities: how often each unit is drawn when `units` units
    are drawn with replacement."""
    rng = np.random.default_rng(seed)
    for _ in range(samples):
        yield np.bincount(rng.integers(0, units, units), minlength=units)


def paired_difference(metric: str, candidate: UnitScores, champion: UnitScores,
                      samples: int = SAMPLES, seed: int = 0,
                      confidence: float = CONFIDENCE) -> PairedDifference:
    """The candidate's `metric` minus the champion's, with its bootstrap interval."""
    if candidate.units != champion.units:
        raise ValueError(f"the candidate scored {candidate.units} units and the champion "
                         f"{champion.units}: a paired comparison needs the same units")
    if candidate.units == 0:
        raise ValueError("no test units to compare the models on")
    ours, theirs = candidate.metric(metric), champion.metric(metric)
    differences = np.array([candidate.metric(metric, w) - champion.metric(metric, w)
                            for w in resample_weights(candidate.units, samples, seed)])
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(differences, [tail, 100 - tail])
    return PairedDifference(metric, ours, theirs, ours - theirs, float(low), float(high),
                            candidate.units, samples, confidence, seed)
