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

from tasks.model import windows
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

    With `window_stride` (long_text window) a sentence is not cut: it becomes the windows of
    tasks/model/windows.py (HF's overflowing tokens with that stride), rows of `input_ids`
    and `labels`; `text` [windows] gives each window's sentence, and `word_starts` and
    `word_windows` [batch, (words)] each word's first piece in the window that speaks for
    it (windows.max_context; -1 without a piece). `align` labels every word start of every
    window (training), `align_max_context` only in the word's own window (evaluation: each
    word scored once).
    """

    def __init__(self, encoder: SegmentEncoder, window_stride: int | None = None):
        super().__init__(name="word_piece_aligner")
        self.encoder = encoder
        self.window_stride = window_stride
        self.max_seq_length = encoder.max_seq_length
        # BertTextEncoder's ids of [CLS] and [SEP] (private there: tokenize.py has no public
        # accessor yet; the wiring can add one).
        self._cls_id, self._sep_id = encoder.cls_id, encoder.sep_id

    @tf.function(input_signature=[_WORDS, _TAG_IDS], autograph=False)
    def align(self, words, tag_ids):
        return self._encode(words, tag_ids)

    @tf.function(input_signature=[_WORDS, _TAG_IDS], autograph=False)
    def align_max_context(self, words, tag_ids):
        return self._encode(words, tag_ids, max_context=True)

    @tf.function(input_signature=[_WORDS], autograph=False)
    def encode_words(self, words):
        return self._encode(words, None)

    def _encode(self, words: tf.RaggedTensor, tag_ids: tf.RaggedTensor | None,
                max_context: bool = False) -> dict:
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
        if self.window_stride is not None:
            return self._windows(words, tag_ids, per_word, first, sentence_pieces,
                                 max_context)
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


    def _windows(self, words, tag_ids, per_word, first, sentence_pieces, max_context):
        """_encode's output with long_text window (see the class)."""
        budget, stride = self.max_seq_length - 2, self.window_stride
        pieces, text = windows.window_pieces(sentence_pieces, budget, stride)
        mine, owner = windows.max_context(sentence_pieces.row_lengths(), budget, stride)
        ids, types = tf_text.combine_segments(
            [pieces], start_of_sequence_id=self._cls_id, end_of_segment_id=self._sep_id)
        # A word's first piece among all pieces -> its own window's copy of it.
        at = tf.gather(sentence_pieces.row_starts(), words.value_rowids()) + first.flat_values
        # A word without a piece reads a padded 0 (masked below): gathers stay in range.
        copy = tf.gather(tf.concat([owner, [0]], 0), tf.minimum(at, tf.size(owner, tf.int64)))
        window = tf.gather(tf.concat([mine.value_rowids(), [0]], 0), copy)
        has_piece = per_word > 0
        untruncated = sentence_pieces.row_lengths() + 2
        out = {"input_ids": ids, "token_type_ids": tf.cast(types, tf.int64), "text": text,
               "word_windows": words.with_flat_values(tf.where(has_piece, window, -1)),
               "word_starts": words.with_flat_values(tf.where(
                   has_piece, copy - tf.gather(mine.row_starts(), window) + 1, -1)),
               "untruncated_lengths": untruncated,
               "num_truncated": tf.reduce_sum(
                   tf.cast(untruncated > self.max_seq_length, tf.int64))}
        if tag_ids is not None:
            flat = _first_piece_tags(tag_ids, per_word)
            labels, _ = windows.window_pieces(
                sentence_pieces.with_flat_values(flat), budget, stride)
            if max_context:
                labels = labels.with_flat_values(tf.where(
                    mine.flat_values, labels.flat_values, tf.constant(IGNORED, tf.int64)))
            out["labels"], _ = tf_text.combine_segments(
                [labels], start_of_sequence_id=IGNORED, end_of_segment_id=IGNORED)
        return out


def _first_piece_tags(tag_ids, per_word) -> tf.Tensor:
    """Each word's tag id on its first piece, IGNORED on the others: flat over all pieces."""
    first_piece = tf.equal(tf.ragged.range(per_word).flat_values, 0)
    word_tag = tf.repeat(tf.cast(tag_ids.flat_values, tf.int64), per_word)
    return tf.where(first_piece, word_tag, tf.constant(IGNORED, tf.int64))


def _piece_labels(tag_ids, per_word, sentence_lengths, budget) -> tf.RaggedTensor:
    """Each word's tag id on its first piece, IGNORED on the others; cut to `budget` pieces
    and framed by IGNORED for [CLS] and [SEP]."""
    labels = tf.RaggedTensor.from_row_lengths(_first_piece_tags(tag_ids, per_word),
                                              sentence_lengths)
    framed, _ = tf_text.combine_segments([labels[:, :budget]], start_of_sequence_id=IGNORED,
                                         end_of_segment_id=IGNORED)
    return framed
