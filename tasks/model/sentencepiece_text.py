"""SentencePiece in the graph (XLM-RoBERTa's `sentencepiece.bpe.model`; the same code serves
any family whose tokenizer is a SentencePiece model with its own special ids):

    encoder = XlmRobertaTextEncoder("sentencepiece.bpe.model", max_seq_length=128)
    ids, types = encoder(texts, pairs)  # <s> A </s></s> B </s>, types all 0

tensorflow-text's FastSentencepieceTokenizer runs a unigram model file (XLM-R's) and its
SentencepieceTokenizer, the SentencePiece library itself, a BPE one: each applies the model's
own normalizer (e.g. nmt_nfkc) and holds the model in the op, so a SavedModel holding it loads
with `tensorflow` and `tensorflow_text` only.
Its piece ids are then laid out as the family numbers them (`IdLayout`): fairseq's XLM-R
dictionary puts `<s> <pad> </s> <unk>` at 0-3, shifts every piece by one and gives the
model's unknown piece id 3, with `<mask>` after the last piece.

Hugging Face's fast tokenizer (transformers 5's XLMRobertaTokenizer, what from_pretrained
builds from the model file) runs the model's normalizer and then splits the text on Unicode
whitespace (Rust's `char::is_whitespace`); the model alone reads the few whitespace characters
its normalizer leaves (U+0085, U+1680 in XLM-R's) as text. Those are made spaces before the
model sees the text (`_kept_whitespace`), which gives Hugging Face's ids on every code point
(tests/test_sentencepiece_text.py checks them all below U+0800, the whitespace, and a sample
above).

DeBERTa-v3's `spm.model` (DebertaTextEncoder) holds its special pieces itself: its ids are the
model's, and Hugging Face splits its words on spaces only (Metaspace), as the model does.

Not done here: Hugging Face also matches the special tokens (`<s>`, `<mask>`...) inside the
raw text and gives their ids; here such text is tokenized as ordinary characters.
"""
from __future__ import annotations

import tensorflow as tf
import tensorflow_text as tf_text

from tasks.model.sentencepiece_model import (CONTROL, FAIRSEQ, UNIGRAM, IdLayout,
                                           deberta_layout, read_model)
from tasks.model.text_encoder import SegmentEncoder

# Rust's char::is_whitespace (what tokenizers' WhitespaceSplit splits on), less the ASCII space.
RUST_WHITESPACE = ("\t\n\x0b\x0c\r\x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200b)))
                   + "\u2028\u2029\u202f\u205f\u3000")


class SentencePieceTextEncoder(SegmentEncoder):
    """Raw strings -> a SentencePiece family's input ids, with `layout`'s special ids:
    `cls a sep` and, for pairs, SegmentEncoder's template (PAIR_SEPARATORS, TOKEN_TYPES of
    the subclass; by default BERT's `cls a sep b sep` with token types 0 then 1, as
    DeBERTa-v3 has it)."""

    # A pre-split word is tokenized on its own, which gives it the model's "▁" prefix as
    # Hugging Face's is_split_into_words does: nothing to add.
    WORD_PREFIX = ""
    # Hugging Face's tokenizer splits words on every Unicode whitespace (XLM-R's
    # WhitespaceSplit); False: on spaces only, as the model does (DeBERTa's Metaspace).
    SPLIT_ON_WHITESPACE = True

    def __init__(self, model_path, layout: IdLayout, max_seq_length: int = 128,
                 name: str = "sentencepiece_text_encoder"):
        super().__init__(name=name)
        data, self.model = read_model(model_path)
        self.layout = layout
        self.vocab_size = layout.vocab_size(self.model)
        self.lower_case = False  # the model's normalizer decides; none of them lower-cases
        self.max_seq_length = max_seq_length
        self._cls_id, self._sep_id = layout.cls, layout.sep
        self.pad_id, self.unk_id = layout.pad, layout.unk
        self._spm_unk = self.model.unk_id
        # The model's bytes become part of the op (and so of a SavedModel). The fast op for
        # unigram models (XLM-R's): its Viterbi breaks ties between equal-scored
        # segmentations ("!" "!!" or "!!" "!") as Hugging Face's does, SentencePiece's own
        # the other way. It reads no BPE model right: those take SentencePiece's op.
        self._tokenizer = (tf_text.FastSentencepieceTokenizer(data)
                           if self.model.model_type == UNIGRAM
                           else tf_text.SentencepieceTokenizer(data, out_type=tf.int32))
        self._whitespace = self._kept_whitespace() if self.SPLIT_ON_WHITESPACE else None

    def _kept_whitespace(self) -> str | None:
        """A regex of the whitespace characters the model's normalizer keeps as they are (XLM-R's
        nmt_nfkc keeps U+0085 and U+1680, makes most others spaces and drops U+000B): Hugging
        Face splits words on them after normalizing, so they must become spaces here. Found by
        tokenizing each between two letters: a character the normalizer drops gives "ab"'s
        pieces; making a space of one it already makes a space changes nothing."""
        probes = [f"a{c}b" for c in RUST_WHITESPACE] + ["ab"]
        pieces = self._tokenizer.tokenize(probes).to_list()
        kept = [c for c, got in zip(RUST_WHITESPACE, pieces) if got != pieces[-1]]
        return "[" + "".join(f"\\x{{{ord(c):x}}}" for c in kept) + "]" if kept else None

    def wordpieces(self, texts) -> tf.RaggedTensor:
        if self._whitespace:
            texts = tf.strings.regex_replace(texts, self._whitespace, " ")
        ids = tf.cast(self._tokenizer.tokenize(texts), tf.int64).with_row_splits_dtype(tf.int64)
        flat = ids.flat_values
        flat = tf.where(tf.equal(flat, self._spm_unk), tf.constant(self.unk_id, tf.int64),
                        flat + self.layout.offset)
        return ids.with_flat_values(flat)


class XlmRobertaTextEncoder(SentencePieceTextEncoder):
    """Raw strings -> XLM-RoBERTa input ids: `<s> A </s>` or `<s> A </s></s> B </s>`, no
    token types, fairseq's ids, truncated like Hugging Face's 'longest_first'."""

    PAIR_SEPARATORS = 2
    TOKEN_TYPES = False

    def __init__(self, model_path, max_seq_length: int = 128):
        super().__init__(model_path, FAIRSEQ, max_seq_length, name="xlm_roberta_text_encoder")
        # fairseq's dictionary replaces the model's first three pieces (<unk> <s> </s>).
        if self.model.unk_id != 0 or self.model.types[1:3] != (CONTROL, CONTROL):
            raise ValueError(f"{model_path}: pieces 0-2 are {list(self.model.pieces[:3])}; "
                             "an XLM-R sentencepiece.bpe.model has <unk> <s> </s> there")


class DebertaTextEncoder(SentencePieceTextEncoder):
    """Raw strings -> DeBERTa-v3 input ids: `[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]` with
    token types 0 then 1 (DebertaV2Tokenizer's), the model's own piece ids, the special ids
    read from its pieces (`deberta_layout`)."""

    SPLIT_ON_WHITESPACE = False

    def __init__(self, model_path, max_seq_length: int = 128):
        _, model = read_model(model_path)
        super().__init__(model_path, deberta_layout(model, str(model_path)), max_seq_length,
                         name="deberta_text_encoder")
