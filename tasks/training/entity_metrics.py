"""Entity-level precision, recall and F1 from BIO tags, scored as conlleval.pl (CoNLL
2000-2003) and seqeval's default mode, its Python port, score them. Pure Python and numpy.

Chunks (entities): one starts at `B-X`, or at `I-X` after `O` or after a tag of another type
(an "ill-formed" `I-X` is not dropped: it opens an entity); it continues over the following
`I-X` of the same type. A sentence's end ends its chunk. A predicted chunk is correct when a
true chunk has the same type, start and end.

Counts first, scores last: `count_entities` gives, per entity type, (true chunks, predicted
chunks, correct chunks) as an int64 array [types, 3] that adds up across batches, replicas
and workers (evaluate sums them, then calls `entity_scores` once on the host).
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from tasks.task_kinds import IGNORED

TRUE, PREDICTED, CORRECT = range(3)  # columns of a counts array


def chunks(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """(type, start, end) of each chunk of one sentence's tags, end exclusive."""
    found = []
    kind, start = None, 0
    for i, tag in enumerate([*tags, "O"]):  # a final O closes the last chunk
        prefix, _, tag_kind = tag.partition("-")
        continues = prefix == "I" and tag_kind == kind
        if kind is not None and not continues:
            found.append((kind, start, i))
            kind = None
        if prefix in ("B", "I") and not continues:
            kind, start = tag_kind, i
    return found


def entity_types(labels: Sequence[str]) -> list[str]:
    """The entity types of a tag vocabulary, sorted: the rows of a counts array."""
    return sorted({label[2:] for label in labels if label != "O"})


def count_entities(true_tags: Iterable[Sequence[str]], predicted_tags: Iterable[Sequence[str]],
                   types: Sequence[str]) -> np.ndarray:
    """int64 [len(types), 3]: per type, true, predicted and correct chunks over sentences
    given as parallel sequences of tag strings. A type not in `types` raises KeyError."""
    row = {kind: i for i, kind in enumerate(types)}
    counts = np.zeros((len(types), 3), np.int64)
    for truth, predicted in zip(true_tags, predicted_tags, strict=True):
        if len(truth) != len(predicted):
            raise ValueError(f"{len(truth)} true tags but {len(predicted)} predicted")
        add_chunk_counts(counts, set(chunks(truth)), set(chunks(predicted)), row)
    return counts


def add_chunk_counts(counts: np.ndarray, true_chunks: set, predicted_chunks: set,
                     row: dict[str, int]) -> None:
    """Add one sentence's true, predicted and correct chunks (type, start, end) to `counts`
    [types, 3], at the rows `row` gives each type."""
    for column, found in ((TRUE, true_chunks), (PREDICTED, predicted_chunks),
                          (CORRECT, true_chunks & predicted_chunks)):
        for kind, _, _ in found:
            counts[row[kind], column] += 1


def count_entity_ids(label_ids: np.ndarray, predicted_ids: np.ndarray,
                     labels: Sequence[str]) -> np.ndarray:
    """count_entities over a batch of word-piece rows [batch, seq] of tag ids (`labels`
    indexes them): only positions whose label is not IGNORED (-100) count, in order, as
    transformers' run_ner keeps them; so each row is a sentence's words that kept a piece."""
    label_ids, predicted_ids = np.asarray(label_ids), np.asarray(predicted_ids)
    names = np.asarray(labels, dtype=object)
    keep = label_ids != IGNORED
    true_tags = [names[row[mask]] for row, mask in zip(label_ids, keep)]
    predicted_tags = [names[row[mask]] for row, mask in zip(predicted_ids, keep)]
    return count_entities(true_tags, predicted_tags, entity_types(labels))


def words_by_text(text_ids: np.ndarray, truth: np.ndarray, predicted: np.ndarray
                  ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Windows of long sentences (long_text window), gathered in any order, put back
    together: (true tag ids, predicted tag ids) per sentence, in id order, each its words in
    order. `text_ids` [windows, 2]: (sentence, window's place in it); `truth`, `predicted`
    [windows, seq]: each word is labelled in the one window that speaks for it
    (tasks/model/windows.max_context), IGNORED elsewhere."""
    order = np.lexsort((text_ids[:, 1], text_ids[:, 0]))
    texts, starts = np.unique(text_ids[order, 0], return_index=True)
    keep = truth[order] != IGNORED
    words = [(t[k], p[k]) for t, p, k in zip(truth[order], predicted[order], keep)]
    bounds = list(starts[1:]) + [len(order)]
    joined = [[np.concatenate(part) for part in zip(*words[a:b])]
              for a, b in zip(starts, bounds)]
    return [j[0] for j in joined], [j[1] for j in joined]


def entity_scores(counts: np.ndarray, types: Sequence[str]) -> dict:
    """{"precision", "recall", "f1" (micro: over all chunks), "macro_f1" (mean of the per-type
    F1 over the types with a true or a predicted chunk, as seqeval's report averages), "per_type":
    {type: {"precision", "recall", "f1", "support", "predicted", "correct"}}}. A ratio with
    nothing to divide by is 0.0, as conlleval prints it."""
    counts = np.asarray(counts, np.int64)
    per_type = {kind: _scores(*map(int, counts[i])) for i, kind in enumerate(types)}
    present = [s["f1"] for s in per_type.values() if s["support"] or s["predicted"]]
    return {**{k: v for k, v in _scores(*map(int, counts.sum(axis=0))).items()
               if k in ("precision", "recall", "f1")},
            "macro_f1": float(np.mean(present)) if present else 0.0,
            "per_type": per_type}


def _scores(true: int, predicted: int, correct: int) -> dict:
    precision = correct / predicted if predicted else 0.0
    recall = correct / true if true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "support": true,
            "predicted": predicted, "correct": correct}
