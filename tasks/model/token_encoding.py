"""Words and their tags -> BERT word pieces and piece labels, in-graph (runs in tf.function and
in a SavedModel), with the map back from pieces to words.

transformers' run_ner convention (label_all_tokens=False): the FIRST word piece of each word
gets the word's tag id; every other piece, [CLS], [SEP] and padding get IGNORED (-100). A
sentence keeps its first max_seq_length - 2 pieces, as a Hugging Face tokenizer called with
`is_split_into_words=True, truncation=True` keeps them (a word may lose its tail pieces; a
word whose first piece is cut off loses its label). `word_starts` maps each word to the
position of its first piece in `input_ids` ([CLS] is position 0), or -1 when the word has no
piece left: truncated away, or made only of characters BERT's normalizer drops (a lone
zero-width space). Predictions are given back per word by gathering at `word_starts`.

The word pieces are the ones the run's text encoder makes (`BertTextEncoder`: same vocabulary,
same lower-casing, same compiled tokenizer; or RoBERTa's byte-level BPE, each word with a
space before it, as RobertaTokenizerFast(add_prefix_space=True) splits words): each word is
tokenized on its own and the pieces regrouped by sentence, so a word is never merged with
its neighbour.
"""
from __future__ import annotations

import tensorflow as tf
import tensorflow_text as tf_text

from tasks.model.text_encoder import SegmentEncoder
from tasks.task_kinds import IGNORED

_WORDS = tf.RaggedTensorSpec([None, None], tf.string)
_TAG_IDS = tf.RaggedTensorSpec([None, None], tf.int64)


class WordPieceAligner(tf.Module):
    """`align(words, tag_ids)` for training data, `encode_words(words)` for serving; both
    take RaggedTensors [batch, (words)] and return a dict of

    - `input_ids`, `token_type_ids` (all 0: one segment): int64 [batch, (pieces)], with
      [CLS] and [SEP], at most max_seq_length long;
    - `labels` (align only): int64 [batch, (pieces)], the word's tag id on its first piece,
      IGNORED (-100) elsewhere;
    - `word_starts`: int64 [batch, (words)], each word's first piece position or -1;
    - `untruncated_lengths`: int64 [batch], the pieces with [CLS]/[SEP] before truncation;
    - `num_truncated`: int64 scalar, the rows longer than max_seq_length.
    """

    def __init__(self, encoder: SegmentEncoder):
        super().__init__(name="word_piece_aligner")
        self.encoder = encoder
        self.max_seq_length = encoder.max_seq_length
        # BertTextEncoder's ids of [CLS] and [SEP] (private there: tokenize.py has no public
        # accessor yet; the wiring can add one).
        self._cls_id, self._sep_id = encoder.cls_id, encoder.sep_id

    @tf.function(input_signature=[_WORDS, _TAG_IDS])
    def align(self, words, tag_ids):
        return self._encode(words, tag_ids)

    @tf.function(input_signature=[_WORDS])
    def encode_words(self, words):
        return self._encode(words, None)

    def _encode(self, words: tf.RaggedTensor, tag_ids: tf.RaggedTensor | None) -> dict:
        flat = words.flat_values
        if self.encoder.WORD_PREFIX:  # RoBERTa: each word as after a space
            flat = tf.strings.join([self.encoder.WORD_PREFIX, flat])
        pieces = self.encoder.wordpieces(flat)  # [all words, (pieces)]
        per_word = pieces.row_lengths()
        # Position of each word's first piece within its sentence, [CLS] not counted.
        offsets = tf.RaggedTensor.from_row_lengths(per_word, words.row_lengths())
        first = tf.math.cumsum(offsets, axis=1, exclusive=True)
        budget = self.max_seq_length - 2
        kept = (per_word > 0) & (first.flat_values < budget)
        starts = tf.where(kept, first.flat_values + 1, -1)  # +1: [CLS]
        # Pieces per sentence; a sentence without words has none.
        lengths = tf.math.unsorted_segment_sum(per_word, words.value_rowids(), words.nrows())
        sentence_pieces = tf.RaggedTensor.from_row_lengths(pieces.flat_values, lengths)
        untruncated = sentence_pieces.row_lengths() + 2
        ids, types = tf_text.combine_segments(
            [sentence_pieces[:, :budget]], start_of_sequence_id=self._cls_id,
            end_of_segment_id=self._sep_id)
        out = {"input_ids": ids, "token_type_ids": tf.cast(types, tf.int64),
               "word_starts": words.with_flat_values(starts),
               "untruncated_lengths": untruncated,
               "num_truncated": tf.reduce_sum(
                   tf.cast(untruncated > self.max_seq_length, tf.int64))}
        if tag_ids is not None:
            out["labels"] = _piece_labels(tag_ids, per_word, lengths, budget)
        return out


def _piece_labels(tag_ids, per_word, sentence_lengths, budget) -> tf.RaggedTensor:
    """Each word's tag id on its first piece, IGNORED on the others; cut to `budget` pieces
    and framed by IGNORED for [CLS] and [SEP]."""
    first_piece = tf.equal(tf.ragged.range(per_word).flat_values, 0)
    word_tag = tf.repeat(tf.cast(tag_ids.flat_values, tf.int64), per_word)
    flat = tf.where(first_piece, word_tag, tf.constant(IGNORED, tf.int64))
    labels = tf.RaggedTensor.from_row_lengths(flat, sentence_lengths)
    framed, _ = tf_text.combine_segments([labels[:, :budget]], start_of_sequence_id=IGNORED,
                                         end_of_segment_id=IGNORED)
    return framed
