"""The gate's paired bootstrap and its per-unit metrics (tasks/gate/): the metrics on the
whole test set equal the evaluate step's definitions, and the interval behaves as a paired
comparison must."""
from __future__ import annotations

import numpy as np
import pytest

from tasks.gate import unit_scores
from tasks.gate.bootstrap import paired_difference, resample_weights
from tasks.steps.evaluate import classification_metrics
from tasks.task_kinds import multi_label_metrics, regression_metrics
from tasks.training import entity_metrics

RNG = np.random.default_rng(7)
LABELS = ["a", "b", "c", "d"]


def _classification(accuracy: float, n: int = 600, seed: int = 0, truth=None):
    """(truth, predictions right with probability `accuracy`); `truth`: given rows' labels."""
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, len(LABELS), n) if truth is None else truth
    wrong = rng.random(n) > accuracy
    predicted = np.where(wrong, (truth + rng.integers(1, len(LABELS), n)) % len(LABELS), truth)
    return truth, predicted


def test_classification_metrics_match_the_evaluate_step():
    truth, predicted = _classification(0.7)
    predicted[predicted == 3] = 2  # a class never predicted: its F1 is 0, as evaluate says
    scores = unit_scores.classification(truth, predicted, LABELS)
    matrix = np.zeros((4, 4), np.int64)
    np.add.at(matrix, (truth, predicted), 1)
    expected = classification_metrics(matrix, LABELS)
    assert scores.metric("accuracy") == pytest.approx(expected["accuracy"], abs=1e-12)
    assert scores.metric("macro_f1") == pytest.approx(expected["macro_f1"], abs=1e-12)
    assert {k: v["f1"] for k, v in scores.per_class_f1().items()} == pytest.approx(
        {k: v["f1"] for k, v in expected["per_class"].items()}, abs=1e-12)


def test_multi_label_metrics_match_the_evaluate_step():
    truth = RNG.random((300, 4)) < 0.3
    predicted = np.where(RNG.random((300, 4)) < 0.2, ~truth, truth)
    scores = unit_scores.multi_label(truth, predicted, LABELS)
    tp = (truth & predicted).sum(0)
    counts = {"per_label": np.stack([tp, (predicted & ~truth).sum(0), (truth & ~predicted).sum(0)]),
              "exact": int((truth == predicted).all(1).sum()), "rows": 300}
    expected = multi_label_metrics(counts, LABELS, 0.5)
    for name in ("micro_f1", "macro_f1", "subset_accuracy"):
        assert scores.metric(name) == pytest.approx(expected[name], abs=1e-12), name


def test_regression_metrics_match_the_evaluate_step():
    truth = np.round(RNG.random(200) * 5, 1)  # ties, as real scores have
    predicted = truth + RNG.normal(0, 1, 200)
    scores = unit_scores.regression(truth, predicted)
    expected = regression_metrics(truth, predicted)
    for name in ("pearson", "spearman", "mse"):
        assert scores.metric(name) == pytest.approx(expected[name], abs=1e-12), name


def test_entity_metrics_match_conlleval_counts_from_served_character_offsets():
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    sentences = [(["John", "Smith", "lives", "in", "New", "York"],
                  ["B-PER", "I-PER", "O", "O", "B-LOC", "I-LOC"]),
                 (["I", "saw", "Paris"], ["O", "O", "B-LOC"]),
                 (["nobody", "here"], ["O", "O"])]
    # Served entities as (type, character start, end) of " ".join(words).
    served = [[("PER", 0, 10), ("LOC", 20, 23)],  # John Smith right; "New" alone is wrong
              [("PER", 6, 11)],  # Paris with the wrong type
              [("LOC", 0, 6)]]  # a spurious one
    found = [unit_scores.word_spans(words, [s for _, s, _ in e], [t for _, _, t in e],
                                    [k for k, _, _ in e])
             for (words, _), e in zip(sentences, served)]
    assert found[0] == {("PER", 0, 2), ("LOC", 4, 5)}
    scores = unit_scores.entities([t for _, t in sentences], found, tags)
    # The same predictions as word tags, through the evaluate step's counting.
    predicted_tags = [["B-PER", "I-PER", "O", "O", "B-LOC", "O"], ["O", "O", "B-PER"],
                      ["B-LOC", "O"]]
    types = entity_metrics.entity_types(tags)
    counts = entity_metrics.count_entities([t for _, t in sentences], predicted_tags, types)
    expected = entity_metrics.entity_scores(counts, types)
    for name in ("f1", "macro_f1", "precision", "recall"):
        assert scores.metric(name) == pytest.approx(expected[name], abs=1e-12), name


def test_a_fixed_seed_gives_a_fixed_interval_and_another_seed_another():
    candidate = unit_scores.classification(*_classification(0.8, seed=1), LABELS)
    champion = unit_scores.classification(*_classification(0.75, seed=1), LABELS)
    first = paired_difference("accuracy", candidate, champion, samples=300, seed=5)
    again = paired_difference("accuracy", candidate, champion, samples=300, seed=5)
    other = paired_difference("accuracy", candidate, champion, samples=300, seed=6)
    assert first == again
    assert (other.low, other.high) != (first.low, first.high)
    assert first.low <= first.difference <= first.high
    assert first.difference == pytest.approx(candidate.metric("accuracy")
                                             - champion.metric("accuracy"))


def test_an_identical_champion_differs_by_zero_with_an_interval_holding_zero():
    scores = unit_scores.classification(*_classification(0.7, seed=3), LABELS)
    for metric in ("accuracy", "macro_f1"):
        result = paired_difference(metric, scores, scores, samples=200, seed=1)
        assert result.difference == 0.0 and result.low <= 0.0 <= result.high


def test_the_interval_separates_a_clearly_better_model_and_straddles_an_equal_one():
    truth, good = _classification(0.9, n=2000, seed=4)
    _, poor = _classification(0.6, n=2000, seed=5, truth=truth)
    _, equal = _classification(0.9, n=2000, seed=6, truth=truth)
    better = paired_difference("accuracy", unit_scores.classification(truth, good, LABELS),
                               unit_scores.classification(truth, poor, LABELS), seed=0)
    assert better.low > 0.2  # 0.9 vs 0.6 on 2,000 rows: far from zero
    worse = paired_difference("accuracy", unit_scores.classification(truth, poor, LABELS),
                              unit_scores.classification(truth, good, LABELS), seed=0)
    assert worse.high < -0.2
    # Two models of one accuracy, wrong on different rows: the interval holds zero.
    tied = paired_difference("accuracy", unit_scores.classification(truth, equal, LABELS),
                             unit_scores.classification(truth, good, LABELS), seed=0)
    assert tied.low < 0 < tied.high


def test_pairing_narrows_the_interval_for_models_wrong_on_the_same_rows():
    """Two models that disagree on a few rows only: the paired interval is narrow, as it
    must be; resampling each model's rows apart would not see the agreement."""
    truth, predicted = _classification(0.8, n=1000, seed=8)
    nudged = predicted.copy()
    flip = np.flatnonzero(predicted != truth)[:10]  # 10 of its errors made right
    nudged[flip] = truth[flip]
    result = paired_difference("accuracy", unit_scores.classification(truth, nudged, LABELS),
                               unit_scores.classification(truth, predicted, LABELS), seed=0)
    assert result.difference == pytest.approx(0.01)
    assert 0.0 < result.low and result.high - result.low < 0.02


def test_resampling_draws_every_unit_count_once_in_total():
    for weights in resample_weights(50, 20, seed=0):
        assert weights.sum() == 50 and weights.min() >= 0


def test_units_must_match():
    a = unit_scores.classification(*_classification(0.8, n=10), LABELS)
    b = unit_scores.classification(*_classification(0.8, n=11), LABELS)
    with pytest.raises(ValueError, match="same units"):
        paired_difference("accuracy", a, b)
