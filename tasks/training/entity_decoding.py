"""Entities of raw input strings from per-word predictions, in TensorFlow ops (it runs in the
exported SavedModel), as transformers' `pipeline("ner", aggregation_strategy="first")` gives
them: `entity_group`, `start` and `end` (character offsets into the input), `word`, `score`.

What "first" does (transformers/pipelines/token_classification.py: aggregate_word,
group_entities, group_sub_entities), and so what this does:
- a word takes the tag of its FIRST word piece's highest probability, and that probability as
  its score (`word_predictions`);
- adjacent words form one entity while their types agree and the later one is not a `B-`
  tag: so `I-X` after `O` or after another type opens a new entity, as in conlleval;
- an entity's score is the mean of its words' scores; its span runs from its first word's
  start to its last word's end; entities of type `O` are dropped.

Differences, on purpose:
- words are the input split on whitespace (Unicode White_Space, tensorflow_text's
  WhitespaceTokenizer), the way the training data's tokens are given; the pipeline's words
  are its tokenizer's pre-tokens, which also split off punctuation. A word "Paris," is one
  word here.
- `word` is the input's own text between `start` and `end` (its case and spacing kept); the
  pipeline decodes the word pieces instead (lower-cased by an uncased vocabulary).
- a word with no word piece left (cut by max_seq_length, or only characters BERT's
  normalizer drops) has no prediction (tag id -1): it belongs to no entity and ends the one
  before it.
Offsets count characters (Unicode code points), as Python's str indexes them.
"""
from __future__ import annotations

import tensorflow as tf
import tensorflow_text as tf_text

NO_PREDICTION = -1


def whitespace_words(texts: tf.Tensor) -> tuple[tf.RaggedTensor, tf.RaggedTensor,
                                                 tf.RaggedTensor]:
    """(words, start, end) of `texts` (tf.string [batch]) split on whitespace: RaggedTensors
    [batch, (words)]; start/end are int64 character offsets, end exclusive."""
    words, byte_starts, byte_ends = tf_text.WhitespaceTokenizer().tokenize_with_offsets(texts)
    _, char_byte_starts = tf.strings.unicode_decode_with_offsets(texts, "UTF-8")
    # Each row's offsets shifted by the bytes of the rows before it: one ascending sequence,
    # so one searchsorted maps every byte offset to the number of characters before it.
    row_bytes = tf.math.cumsum(
        tf.cast(tf.strings.length(texts, unit="BYTE"), tf.int64), exclusive=True)
    row_chars = tf.math.cumsum(char_byte_starts.row_lengths(), exclusive=True)
    flat_chars = tf.cast(char_byte_starts.flat_values, tf.int64) + tf.gather(
        row_bytes, char_byte_starts.value_rowids())

    def to_chars(byte_offsets: tf.RaggedTensor) -> tf.RaggedTensor:
        rows = byte_offsets.value_rowids()
        flat = tf.cast(byte_offsets.flat_values, tf.int64) + tf.gather(row_bytes, rows)
        chars = tf.searchsorted(flat_chars, flat, side="left", out_type=tf.int64)
        return byte_offsets.with_flat_values(chars - tf.gather(row_chars, rows))

    return words, to_chars(byte_starts), to_chars(byte_ends)


def word_predictions(probabilities: tf.Tensor, word_starts: tf.RaggedTensor,
                     word_rows: tf.RaggedTensor | None = None
                     ) -> tuple[tf.RaggedTensor, tf.RaggedTensor]:
    """(tag id, score) per word: argmax and max of the probabilities [batch, seq, labels] at
    the word's first piece (`word_starts` of tasks/model/token_encoding.py); tag id
    NO_PREDICTION (-1) and score 0 for a word without a piece (start -1). `word_rows`: the
    row of `probabilities` holding each word (long_text window: its window), else the
    word's own text's."""
    starts = word_starts.flat_values
    rows = (word_starts.value_rowids() if word_rows is None
            else tf.maximum(word_rows.flat_values, 0))
    at = tf.gather_nd(probabilities, tf.stack([rows, tf.maximum(starts, 0)], axis=1))
    has_piece = starts >= 0
    tags = tf.where(has_piece, tf.argmax(at, axis=-1), NO_PREDICTION)
    scores = tf.where(has_piece, tf.reduce_max(at, axis=-1), 0.0)
    return word_starts.with_flat_values(tags), word_starts.with_flat_values(scores)


def decode_entities(texts: tf.Tensor, starts: tf.RaggedTensor, ends: tf.RaggedTensor,
                    tag_ids: tf.RaggedTensor, scores: tf.RaggedTensor,
                    labels: list[str]) -> dict[str, tf.RaggedTensor]:
    """The entities of each text, RaggedTensors [batch, (entities)]: `entity_group` and
    `word` (tf.string), `start` and `end` (int64 characters), `score` (float32). `starts`,
    `ends`, `tag_ids` and `scores` are per word [batch, (words)]; `labels` names tag ids
    ("O", "B-X", "I-X", ...)."""
    types = sorted({label[2:] for label in labels if label != "O"})
    # Per tag id, shifted by one so that NO_PREDICTION (-1) reads entry 0: the type's index
    # (0 for O and for no prediction) and whether it is a B- tag.
    type_of = tf.constant([0] + [0 if label == "O" else 1 + types.index(label[2:])
                                 for label in labels], tf.int64)
    begins = tf.constant([False] + [label.startswith("B-") for label in labels])
    flat_tags = tf.cast(tag_ids.flat_values, tf.int64) + 1
    word_type, word_begins = tf.gather(type_of, flat_tags), tf.gather(begins, flat_tags)
    rows = tag_ids.value_rowids()
    first_in_row = tf.equal(tf.ragged.range(tag_ids.row_lengths()).flat_values, 0)
    previous_type = tf.concat([tf.constant([-1], tf.int64), word_type[:-1]], axis=0)
    opens = first_in_row | word_begins | tf.not_equal(word_type, previous_type)
    group = tf.math.cumsum(tf.cast(opens, tf.int64)) - 1

    group_type = tf.math.segment_max(word_type, group)
    keep = group_type > 0  # groups of O words and of words without prediction go
    row = tf.boolean_mask(tf.math.segment_min(rows, group), keep)
    start = tf.boolean_mask(tf.math.segment_min(starts.flat_values, group), keep)
    end = tf.boolean_mask(tf.math.segment_max(ends.flat_values, group), keep)
    score = tf.boolean_mask(
        tf.math.segment_mean(tf.cast(scores.flat_values, tf.float32), group), keep)
    kind = tf.gather(tf.constant(types or [""]), tf.boolean_mask(group_type, keep) - 1)
    word = tf.strings.substr(tf.gather(texts, row), start, end - start, unit="UTF8_CHAR")
    nrows = tf.shape(texts, out_type=tf.int64)[0]
    return {name: tf.RaggedTensor.from_value_rowids(values, row, nrows=nrows)
            for name, values in (("entity_group", kind), ("start", start), ("end", end),
                                 ("word", word), ("score", score))}
