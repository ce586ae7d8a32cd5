"""tasks/training/entity_metrics.py against conlleval.pl's own results.

The expected numbers were produced by running conlleval.pl version 2004-01-26 (Erik Tjong
Kim Sang, the CoNLL-2003 release: hyphens allowed in types) with `perl conlleval.pl <
cases.txt`, cases.txt holding CASES as `word true predicted` lines with an empty line after
each sentence; its per-type counts were printed by one extra printf of its %foundCorrect,
%foundGuessed and %correctChunk. The same script agreed with count_entities on 300 random
batches of up to 6 sentences over 3 types (one hyphenated) while this module was written.
"""
from __future__ import annotations

import numpy as np
import pytest

from tasks.training.entity_metrics import (CORRECT, IGNORED, PREDICTED, TRUE, chunks,
                                           count_entities, count_entity_ids, entity_scores,
                                           entity_types)

CASES = [  # (true, predicted) sentences
    (["O", "I-PER", "I-PER", "O"], ["O", "B-PER", "I-PER", "O"]),  # I- after O
    (["B-LOC", "I-PER", "O"], ["B-LOC", "I-LOC", "O"]),  # I- of another type
    (["B-PER", "B-PER"], ["B-PER", "I-PER"]),  # B- after B-
    (["O", "B-ORG", "I-ORG"], ["O", "B-ORG", "I-ORG"]),  # a chunk at the sentence's end
    (["I-ORG", "O"], ["I-ORG", "O"]),  # ... not continued by the next sentence's I-
    (["O", "O", "O"], ["O", "B-MISC", "O"]),  # an all-O sentence
    (["B-PER", "I-PER"], ["B-ORG", "I-ORG"]),  # the wrong type
    (["B-LOC", "I-LOC", "I-LOC"], ["B-LOC", "I-LOC", "O"]),  # too short
    (["B-creative-work", "I-creative-work", "O"],
     ["B-creative-work", "I-creative-work", "B-creative-work"]),
    (["O", "B-LOC"], ["I-LOC", "I-LOC"]),  # I- after O in the prediction
]
TYPES = ["LOC", "MISC", "ORG", "PER", "creative-work"]
# conlleval.pl: "processed 27 tokens with 11 phrases; found: 11 phrases; correct: 4."
CONLLEVAL_COUNTS = {"LOC": (3, 3, 0), "MISC": (0, 1, 0), "ORG": (2, 3, 2), "PER": (5, 2, 1),
                    "creative-work": (1, 2, 1)}  # (true, predicted, correct)
# conlleval.pl's printed percentages: overall, then per type (precision, recall, FB1).
CONLLEVAL_OVERALL = (36.36, 36.36, 36.36)
CONLLEVAL_PER_TYPE = {"LOC": (0.00, 0.00, 0.00), "MISC": (0.00, 0.00, 0.00),
                      "ORG": (66.67, 100.00, 80.00), "PER": (50.00, 20.00, 28.57),
                      "creative-work": (50.00, 100.00, 66.67)}


def test_chunks_follow_conlleval_starts_and_ends():
    assert chunks(["O", "I-PER", "I-PER", "O"]) == [("PER", 1, 3)]
    assert chunks(["B-LOC", "I-PER", "I-PER"]) == [("LOC", 0, 1), ("PER", 1, 3)]
    assert chunks(["B-PER", "B-PER", "I-PER"]) == [("PER", 0, 1), ("PER", 1, 3)]
    assert chunks(["O", "O"]) == [] and chunks([]) == []


def test_counts_match_conlleval():
    counts = count_entities([t for t, _ in CASES], [p for _, p in CASES], TYPES)
    assert {kind: tuple(counts[i]) for i, kind in enumerate(TYPES)} == CONLLEVAL_COUNTS


def test_scores_match_conlleval_printout():
    counts = count_entities([t for t, _ in CASES], [p for _, p in CASES], TYPES)
    scores = entity_scores(counts, TYPES)
    as_printed = lambda s: tuple(round(100 * s[k], 2) for k in ("precision", "recall", "f1"))
    assert as_printed(scores) == CONLLEVAL_OVERALL
    assert {k: as_printed(v) for k, v in scores["per_type"].items()} == CONLLEVAL_PER_TYPE
    # seqeval 1.2.2's f1_score(truth, predicted, average="macro") on CASES, run in a
    # throwaway venv: the mean F1 of the types with a true or a predicted chunk.
    assert scores["macro_f1"] == pytest.approx(0.3504761904761905)


def test_counts_add_up_across_batches():
    truth, predicted = [t for t, _ in CASES], [p for _, p in CASES]
    whole = count_entities(truth, predicted, TYPES)
    parts = sum(count_entities(truth[i:i + 3], predicted[i:i + 3], TYPES)
                for i in range(0, len(CASES), 3))
    np.testing.assert_array_equal(parts, whole)
    assert whole[:, [TRUE, PREDICTED, CORRECT]].sum() == 11 + 11 + 4


def test_count_entity_ids_keeps_labelled_pieces_only():
    labels = ["O", "B-LOC", "B-PER", "I-LOC", "I-PER"]
    assert entity_types(labels) == ["LOC", "PER"]
    x = IGNORED
    # [CLS] New York ##er [SEP] pad; the ignored pieces' predictions do not count.
    label_ids = np.array([[x, 1, 3, x, x, x], [x, 2, 0, x, x, x]])
    predicted = np.array([[0, 1, 3, 2, 2, 2], [4, 4, 0, 1, 1, 1]])
    counts = count_entity_ids(label_ids, predicted, labels)
    # Row 2 predicts I-PER for a B-PER word: it opens the same entity, so it is correct.
    np.testing.assert_array_equal(counts, [[1, 1, 1], [1, 1, 1]])
