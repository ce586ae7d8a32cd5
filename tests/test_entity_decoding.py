"""tasks/training/entity_decoding.py on hand-made cases, and its grouping against transformers'
own TokenClassificationPipeline.group_entities (what aggregation_strategy="first" runs after
giving each word its first piece's tag and probability) on seeded random tags."""
from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from tasks.training.entity_decoding import (NO_PREDICTION, decode_entities, whitespace_words,
                                            word_predictions)

LABELS = ["O", "B-loc", "B-person", "I-loc", "I-person"]
TEXTS = ["  Café Müller\tin  Zürich ", "", "Empire State Building = ESB ."]


def ragged(rows, dtype):
    return tf.ragged.constant(rows, dtype=dtype, row_splits_dtype=tf.int64)


def as_lists(entities: dict) -> list[list[tuple]]:
    columns = {k: v.to_list() for k, v in entities.items()}
    return [[(kind.decode(), start, end, word.decode(), round(score, 4))
             for kind, start, end, word, score in zip(*(columns[k][row] for k in (
                 "entity_group", "start", "end", "word", "score")))]
            for row in range(len(columns["start"]))]


def test_whitespace_words_have_character_offsets():
    words, starts, ends = whitespace_words(tf.constant(TEXTS))
    for text, row_words, row_starts, row_ends in zip(TEXTS, words.to_list(), starts.to_list(),
                                                     ends.to_list()):
        spans = [(m.group(), m.start(), m.end()) for m in re.finditer(r"\S+", text)]
        assert [(w.decode(), s, e) for w, s, e in zip(row_words, row_starts, row_ends)] == spans


def test_entities_of_a_sentence():
    """WNUT17's first train sentence, by hand: a three-word location, O, a one-word one."""
    texts = tf.constant(TEXTS[2:])
    _, starts, ends = whitespace_words(texts)
    tags = ragged([[1, 3, 3, 0, 1, 0]], tf.int64)
    scores = ragged([[0.9, 0.8, 0.7, 0.99, 0.6, 0.99]], tf.float32)
    decode = tf.function(lambda *args: decode_entities(*args, LABELS))
    assert as_lists(decode(texts, starts, ends, tags, scores)) == [[
        ("loc", 0, 21, "Empire State Building", 0.8), ("loc", 24, 27, "ESB", 0.6)]]


def test_words_without_prediction_end_entities_and_rows_may_be_empty():
    texts = tf.constant(["Ada Lovelace Byron x", "", "nothing here"])
    _, starts, ends = whitespace_words(texts)
    tags = ragged([[2, 4, NO_PREDICTION, 4], [], [0, 0]], tf.int64)
    scores = ragged([[0.5, 0.7, 0.0, 0.9], [], [0.9, 0.9]], tf.float32)
    assert as_lists(decode_entities(texts, starts, ends, tags, scores, LABELS)) == [
        [("person", 0, 12, "Ada Lovelace", 0.6), ("person", 19, 20, "x", 0.9)], [], []]


def test_word_predictions_read_the_first_piece():
    probabilities = tf.constant([[[0.1, 0.9], [0.7, 0.3], [0.2, 0.8]]])
    tags, scores = word_predictions(probabilities, ragged([[1, 2, -1]], tf.int64))
    assert tags.to_list() == [[0, 1, NO_PREDICTION]]
    np.testing.assert_allclose(scores.flat_values, [0.7, 0.8, 0.0])


def pipeline_groups(words, spans, tags, scores):
    """transformers' group_entities on the words "first" aggregation makes, O dropped."""
    from transformers.pipelines.token_classification import TokenClassificationPipeline as P

    fake = SimpleNamespace(tokenizer=SimpleNamespace(convert_tokens_to_string=" ".join))
    fake.get_tag = lambda name: P.get_tag(fake, name)
    fake.group_sub_entities = lambda entities: P.group_sub_entities(fake, entities)
    entities = [{"entity": LABELS[t], "score": np.float32(s), "word": w, "start": a, "end": b}
                for w, (a, b), t, s in zip(words, spans, tags, scores)]
    return [(g["entity_group"], g["start"], g["end"], round(float(g["score"]), 4))
            for g in P.group_entities(fake, entities) if g["entity_group"] != "O"]


@pytest.mark.parametrize("seed", range(3))
def test_grouping_matches_the_pipelines_group_entities(seed):
    rng = np.random.default_rng(seed)
    texts = [" ".join(f"w{i}" * rng.integers(1, 3) for i in range(rng.integers(0, 12)))
             for _ in range(40)]
    words, starts, ends = whitespace_words(tf.constant(texts))
    tags = [rng.integers(0, len(LABELS), len(row)).tolist() for row in words.to_list()]
    scores = [rng.uniform(0.2, 1, len(row)).astype(np.float32).tolist() for row in tags]
    ours = as_lists(decode_entities(tf.constant(texts), starts, ends, ragged(tags, tf.int64),
                                    ragged(scores, tf.float32), LABELS))
    for row, text in enumerate(texts):
        expected = pipeline_groups([w.decode() for w in words[row].numpy()],
                                   zip(starts[row].numpy(), ends[row].numpy()), tags[row],
                                   scores[row])
        assert [(k, s, e, score) for k, s, e, _, score in ours[row]] == expected
        assert all(word == text[s:e] for _, s, e, word, _ in ours[row])


def test_runs_in_a_saved_model(tmp_path):
    module = tf.Module()
    module.decode = tf.function(
        lambda texts, tags, scores: decode_entities(
            texts, *whitespace_words(texts)[1:], tags, scores, LABELS),
        input_signature=[tf.TensorSpec([None], tf.string),
                         tf.RaggedTensorSpec([None, None], tf.int64),
                         tf.RaggedTensorSpec([None, None], tf.float32)])
    tf.saved_model.save(module, str(tmp_path))
    loaded = tf.saved_model.load(str(tmp_path))
    out = loaded.decode(tf.constant(["à Paris"]), ragged([[0, 1]], tf.int64),
                        ragged([[0.9, 0.5]], tf.float32))
    assert as_lists(out) == [[("loc", 2, 7, "Paris", 0.5)]]
