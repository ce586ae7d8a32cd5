"""The text normalisation of transformers' `BertTokenizerFast` (the tokenizers library's
`BertNormalizer`), in TensorFlow and tensorflow-text ops, for `BertTextEncoder`.

tensorflow-text's FastBertTokenizer has its own normaliser, which differs from Hugging Face's
(found by tests/test_wordpiece_parity.py, which checks every BMP code point and a seeded
sample of the rest):

- it splits a word at a control or format character (`a\\x00b` -> `a`, `b`); Hugging Face
  deletes them (`ab`), as it does U+FFFD and private-use characters;
- its `lower_case_nfd_strip_accents` is NFKC case folding: `ß` -> `ss`, `ﬁ` -> `fi`,
  `²` -> `2`, `Ⅻ` -> `xii`, `ǅ` -> `dz`; Hugging Face decomposes canonically (NFD), drops
  nonspacing marks (Mn) and lower-cases: `ß`, `ﬁ`, `²` stay, `Ⅻ` -> `ⅻ`, `ǅ` -> `ǆ`;
- it caps a word at 100 bytes; Hugging Face at 100 characters (a 40-letter Thai word).

So the encoder runs the steps below, in Hugging Face's order, and gives FastBertTokenizer only
the rest of its job (whitespace, punctuation and CJK splitting; WordPiece). The ops are core
TensorFlow and tensorflow-text's: a SavedModel holding them needs no custom op. What still
differs (Unicode table versions, one CJK range) is in docs/model.md and
tests/wordpiece_known_differences.txt, asserted by the parity test.
"""
from __future__ import annotations

import tensorflow as tf
import tensorflow_text as tf_text

# What BertNormalizer's clean_text deletes: NUL, U+FFFD and Unicode "other" characters
# (control except \t \n \r, which become spaces; format; private use; surrogates cannot
# occur in UTF-8). Unassigned code points are kept, as Hugging Face keeps them.
DELETED = r"[\x00-\x08\x0B\x0C\x0E-\x1F\x7F-\x9F\p{Cf}\p{Co}\x{FFFD}]"
NONSPACING_MARKS = r"\p{Mn}"
# Hugging Face lower-cases one character at a time (Σ -> σ everywhere); tf.strings.lower
# (ICU) would write a word-final sigma as ς.
CAPITAL_SIGMA = "\u03a3"
# WordPiece gives [UNK] for a word longer than MAX_WORD_CHARS characters (Hugging Face's
# max_input_chars_per_word); FastBertTokenizer counts bytes instead. The encoder lets it take
# up to MAX_WORD_BYTES and replaces a longer word here by one it cannot piece. A word ends at
# whitespace, punctuation (ASCII symbols count) and CJK ideographs, as Hugging Face's
# BertPreTokenizer splits (a counted regex, [^...]{101,}, is too big for RE2's DFA).
MAX_WORD_CHARS = 100
MAX_WORD_BYTES = 4 * MAX_WORD_CHARS
_CJK = (r"\x{3400}-\x{4DBF}\x{4E00}-\x{9FFF}\x{F900}-\x{FAFF}\x{20000}-\x{2A6DF}"
        r"\x{2A700}-\x{2B73F}\x{2B740}-\x{2B81F}\x{2B820}-\x{2CEAF}\x{2F800}-\x{2FA1F}")
WORD_END = r"[\s\p{Z}\p{P}!-/:-@\[-`{-~" + _CJK + "]"
UNPIECEABLE = "x" * (MAX_WORD_BYTES + 1)


# Printable ASCII, tab and line breaks: nothing to delete, decompose or strip, so such a text
# (most of an English data set's) only needs lower-casing; the other steps run on the rest.
# Cleaning, NFD and the mark strip on every text made the tokenizer about 3x slower.
PLAIN = r"[\t\n\r -~]*"
_TEXTS = tf.TensorSpec([None], tf.string)


def normalize(texts: tf.Tensor, lower_case: bool,
              strip_accents: bool | None = None) -> tf.Tensor:
    """UTF-8 strings as BertNormalizer(clean_text=True, strip_accents=strip_accents,
    lowercase=lower_case) leaves them (CJK spacing is left to FastBertTokenizer); accents
    follow lower_case where strip_accents is None, as there. A traced function: the tokenize
    step calls it eagerly, where op-by-op dispatch cost 2.5x its work (by hand, no results
    file)."""
    strip = lower_case if strip_accents is None else strip_accents
    return _NORMALIZE[bool(lower_case), bool(strip)](texts)


def _normalize(texts: tf.Tensor, lower_case: bool, strip_accents: bool) -> tf.Tensor:
    rows = tf.where(~tf.strings.regex_full_match(texts, PLAIN))
    rest = tf.strings.regex_replace(tf.gather_nd(texts, rows), DELETED, "")
    if strip_accents:  # before lower-casing, as BertNormalizer does
        rest = tf_text.normalize_utf8(rest, "NFD")
        rest = tf.strings.regex_replace(rest, NONSPACING_MARKS, "")
    if lower_case:
        rest = tf.strings.regex_replace(rest, CAPITAL_SIGMA, "\u03c3")
        rest = tf.strings.lower(rest, encoding="utf-8")  # ICU's, per character
        texts = tf.strings.lower(texts)  # ASCII's, several times faster, for the plain ones
    return _cap_long_words(tf.tensor_scatter_nd_update(texts, rows, rest))


_NORMALIZE = {(case, strip): tf.function(
    lambda texts, case=case, strip=strip: _normalize(texts, case, strip),
    input_signature=[_TEXTS], autograph=False) for case in (True, False) for strip in (True, False)}


def _cap_long_words(texts: tf.Tensor) -> tf.Tensor:
    """Each word of more than MAX_WORD_CHARS characters replaced by UNPIECEABLE. Such a word
    lies inside a whitespace-separated token of more than MAX_WORD_CHARS bytes: only texts
    with one are split at WORD_END (the split of every long text was half the normaliser's
    time on SST-2, by hand, no results file)."""
    long_texts = tf.where(tf.strings.length(texts) > MAX_WORD_CHARS)[:, 0]
    tokens = tf.strings.split(tf.gather(texts, long_texts))  # at ASCII whitespace
    longest = tf.reduce_max(tf.strings.length(tokens), axis=1)
    rows = tf.gather(long_texts, tf.where(longest > MAX_WORD_CHARS))
    parts = tf_text.regex_split(tf.gather_nd(texts, rows), WORD_END, WORD_END)  # words, ends
    long = tf.strings.length(parts.flat_values, unit="UTF8_CHAR") > MAX_WORD_CHARS
    capped = tf.where(long, UNPIECEABLE, parts.flat_values)
    joined = tf.strings.reduce_join(parts.with_flat_values(capped), axis=-1)
    return tf.tensor_scatter_nd_update(texts, rows, joined)
