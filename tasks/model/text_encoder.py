"""`BertTextEncoder`, the project's WordPiece tokenizer: raw strings -> BERT input ids,
in-graph (tensorflow-text's FastBertTokenizer) and exportable in a SavedModel; `SegmentEncoder`,
its special-token assembly and truncation, shared with RoBERTa's (tasks/model/byte_bpe.py).
The tokenize step writes the TFRecords with it and the export step embeds it beside the model,
so serving cannot drift from training (tasks/steps/tokenize.py has the step's side: caching
and serialization).

The tokenizer's compiled models (fast-wordpiece flatbuffer of the vocab; BERT normalizer,
slow the first time in a process; timed by hand, no results file) are built once per (vocab,
options, tensorflow-text version) and kept in memory and in a local disk cache
(`model_cache_dir()`), and handed to TensorFlow as a numpy buffer (tensorflow_text would
otherwise convert the 1.7 MB model through a Python list of ints).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

from tasks.io import storage
from tasks.model.wordpiece_normalizer import MAX_WORD_BYTES, normalize

_STRINGS = tf.TensorSpec([None], tf.string)

# tensorflow_text's FastBertTokenizer defaults but the word length (wordpiece_normalizer.py
# caps words in characters), which the compiled model bakes in.
_WORDPIECE = {"suffix_indicator": "##", "max_bytes_per_word": MAX_WORD_BYTES,
              "unknown_token": "[UNK]", "no_pretokenization": False,
              "support_detokenization": False}
MODEL_CACHE_ENV = "BERTFLOW_TOKENIZER_CACHE"  # folder; empty string disables the disk cache
_models: dict[str, tuple[bytes, bytes]] = {}


class SegmentEncoder(tf.Module):
    """Raw strings (and pairs) -> model input ids with the family's special tokens, in-graph
    and exportable in a SavedModel. A subclass sets `_cls_id`, `_sep_id`, `vocab_size`,
    `max_seq_length`, `lower_case` and implements `wordpieces(texts)`.

    Single texts: `cls a sep`. Pairs: `cls a sep b sep` with token types 0 then 1 (BERT), or
    with PAIR_SEPARATORS 2 and no token types `cls a sep sep b sep` (RoBERTa's `<s> A </s></s>
    B </s>`). Truncation matches Hugging Face's 'longest_first' (`_keep_lengths`).
    """

    PAIR_SEPARATORS = 1  # separators between the two segments of a pair
    strip_accents = None  # WordPiece only: set apart from lower_case (tasks/model/casing.py)
    TOKEN_TYPES = True  # False: token_type_ids are all 0 (the family has none)
    WORD_PREFIX = ""  # put before each word of a pre-split sentence (token classification)

    @property
    def cls_id(self) -> int:
        return self._cls_id

    @property
    def sep_id(self) -> int:
        return self._sep_id

    def __call__(self, texts, pairs=None):
        """(input_ids, token_type_ids) as int64 RaggedTensors [batch, (tokens)]."""
        if pairs is None:
            return self.encode(texts)
        return self.encode_pair(texts, pairs)

    @tf.function(input_signature=[_STRINGS], autograph=False)
    def encode(self, texts):
        ids, types, _ = self.encode_with_lengths(texts)
        return ids, types

    @tf.function(input_signature=[_STRINGS, _STRINGS], autograph=False)
    def encode_pair(self, texts, pairs):
        ids, types, _ = self.encode_with_lengths(texts, pairs)
        return ids, types

    def special_count(self, num_segments: int) -> int:
        """Special tokens a row of num_segments segments carries."""
        return 2 if num_segments == 1 else 2 + self.PAIR_SEPARATORS

    def encode_with_lengths(self, texts, pairs=None):
        """Like __call__, plus each row's length before truncation (with special tokens)."""
        first = self.wordpieces(texts)
        if pairs is None:
            untruncated = first.row_lengths() + 2
            keep = _keep_lengths([first.row_lengths()], self.max_seq_length, tf)
            segments = [_head(first, keep[0])]
        else:
            second = self.wordpieces(pairs)
            untruncated = first.row_lengths() + second.row_lengths() + self.special_count(2)
            keep = _keep_lengths([first.row_lengths(), second.row_lengths()],
                                 self.max_seq_length, tf, self.special_count(2))
            head = _head(second, keep[1])
            for _ in range(self.PAIR_SEPARATORS - 1):  # the extra separators open b
                opener = tf.fill([head.nrows(), 1], tf.constant(self._sep_id, tf.int64))
                head = tf.concat([tf.RaggedTensor.from_tensor(opener), head], axis=1)
            segments = [_head(first, keep[0]), head]
        ids, types = tf_text.combine_segments(
            segments, start_of_sequence_id=self._cls_id, end_of_segment_id=self._sep_id)
        types = tf.cast(types, tf.int64)
        if not self.TOKEN_TYPES:
            types = tf.zeros_like(types)
        return ids, types, untruncated

    def wordpieces(self, texts) -> tf.RaggedTensor:
        """Token ids of each text, before truncation and without special tokens."""
        raise NotImplementedError

    def encode_numpy(self, texts, pairs=None):
        """encode_with_lengths for the tokenize step, as numpy arrays: (flat input ids, row
        lengths, flat token type ids, pre-truncation lengths).

        Same wordpieces (same op) and the same truncation rule (`_keep_lengths`); only the
        special-token assembly is done in numpy instead of TensorFlow ops, which in a fresh
        process cost time each to instantiate (about 50 of them) and are slower than numpy on
        int64 vectors (by hand, no results file). tests/test_tokenize.py checks both paths
        give identical output.
        """
        segments = []
        for batch in (texts,) if pairs is None else (texts, pairs):
            rt = self.wordpieces(tf.constant(batch, dtype=tf.string))
            segments.append((rt.flat_values.numpy(), rt.row_lengths().numpy()))
        specials = self.special_count(len(segments))
        keep = _keep_lengths([lengths for _, lengths in segments], self.max_seq_length, np,
                             specials)
        untruncated = sum(lengths for _, lengths in segments) + specials
        parts = [(values, lengths, k) for (values, lengths), k in zip(segments, keep)]
        for _ in range(self.PAIR_SEPARATORS - 1 if pairs is not None else 0):
            parts[1] = _prefix_rows(*parts[1], self._sep_id)
        ids, lengths, types = _combine_numpy(parts, self._cls_id, self._sep_id)
        if not self.TOKEN_TYPES:
            types = np.zeros_like(types)
        return ids, lengths, types, untruncated


class BertTextEncoder(SegmentEncoder):
    """Raw strings -> BERT input ids, in-graph and exportable in a SavedModel.

    Matches transformers' `BertTokenizerFast(do_lower_case=lower_case,
    strip_accents=strip_accents)` token for token (its normalisation is
    wordpiece_normalizer.py's; docs/model.md lists what still differs),
    including truncation: single texts keep their first max_seq_length - 2 tokens; pairs are
    cut like Hugging Face's 'longest_first' (when both segments must shrink, the budget is
    split evenly and an odd token goes to the longer, or to the second when they tie).
    tensorflow_text's ShrinkLongestTrimmer breaks that tie the other way, so the rule is
    computed here.
    """

    def __init__(self, vocab_path, lower_case: bool = True, max_seq_length: int = 128,
                 strip_accents: bool | None = None):
        super().__init__(name="bert_text_encoder")
        text = storage.read_text(str(vocab_path))
        vocab = text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")
        self.vocab_size = len(vocab)
        self.lower_case = lower_case
        self.strip_accents = strip_accents  # None: as lower_case
        self.max_seq_length = max_seq_length
        self._cls_id = vocab.index("[CLS]")
        self._sep_id = vocab.index("[SEP]")
        # The vocabulary is compiled into a constant the traced functions capture, so a
        # SavedModel holding this module needs no vocab file at serving time.
        models = tokenizer_models(vocab)
        if models is None:  # tensorflow_text's model builders moved: the public API
            self._tokenizer = tf_text.FastBertTokenizer(
                vocab=vocab, token_out_type=tf.int64, lower_case_nfd_strip_accents=False,
                **{k: v for k, v in _WORDPIECE.items()})
        else:
            wordpiece, normalizer = models
            self._tokenizer = tf_text.FastBertTokenizer(
                token_out_type=tf.int64,
                fast_wordpiece_model_buffer=_uint8_tensor(wordpiece),
                fast_bert_normalizer_model_buffer=_uint8_tensor(normalizer))

    def wordpieces(self, texts) -> tf.RaggedTensor:
        """Token ids of each text, before truncation and without [CLS]/[SEP]."""
        return self._tokenizer.tokenize(normalize(texts, self.lower_case, self.strip_accents))


def _head(rt: tf.RaggedTensor, keep: tf.Tensor) -> tf.RaggedTensor:
    """The first keep[i] items of each row i."""
    starts = rt.row_starts()
    positions = tf.ragged.range(starts, starts + keep).values
    return tf.RaggedTensor.from_row_lengths(tf.gather(rt.values, positions), keep)


def _keep_lengths(lengths: list, max_seq_length: int, xp, specials: int = 3) -> list:
    """Tokens each segment keeps (xp: tf or np, the same rule for both).

    One segment keeps its first max_seq_length - 2 tokens. Two segments (with `specials`
    special tokens around them: 3 for BERT, 4 for RoBERTa) are cut like
    Hugging Face tokenizers' LongestFirst, vectorized over rows: if the shorter segment fits
    in half the budget it stays whole and the longer one takes the rest; otherwise both get
    half, the odd token going to the longer one (to the second when they tie).
    """
    if len(lengths) == 1:
        return [xp.minimum(lengths[0], max_seq_length - 2)]
    len_a, len_b = lengths
    budget = max_seq_length - specials
    short = xp.minimum(len_a, len_b)
    short_whole = 2 * short <= budget
    keep_short = xp.where(short_whole, short, budget // 2)
    keep_long = xp.where(short_whole, budget - short, budget - budget // 2)
    a_longer = len_a > len_b
    keep_a = xp.minimum(len_a, xp.where(a_longer, keep_long, keep_short))
    keep_b = xp.minimum(len_b, xp.where(a_longer, keep_short, keep_long))
    return [keep_a, keep_b]


def _prefix_rows(values, lengths, keep, token: int):
    """(flat values, row lengths, keep) of rows that each start with `token`."""
    values = np.insert(np.asarray(values, np.int64), np.cumsum(lengths) - lengths, token)
    return values, np.asarray(lengths) + 1, np.asarray(keep) + 1


def _combine_numpy(parts, cls_id: int, sep_id: int):
    """Rows `[CLS] a[:keep_a] [SEP]` (or `... [SEP] b[:keep_b] [SEP]`), as
    tensorflow_text.combine_segments builds them: (flat ids, row lengths, flat type ids).
    parts: [(flat values, row lengths, keep)] per segment, numpy int64."""
    out_len = 1 + sum(np.asarray(keep, np.int64) + 1 for _, _, keep in parts)
    ends = np.cumsum(out_len)
    ids = np.empty(int(ends[-1]) if len(ends) else 0, np.int64)
    types = np.zeros(len(ids), np.int64)
    begin = ends - out_len
    ids[begin] = cls_id
    begin += 1
    for s, (values, lengths, keep) in enumerate(parts):
        values = np.asarray(values, np.int64)
        kept = values
        if not np.array_equal(keep, lengths):  # truncated rows: drop their tails
            row_start = np.repeat(np.cumsum(lengths) - lengths, lengths)
            kept = values[np.arange(len(values)) - row_start < np.repeat(keep, lengths)]
        dst = np.repeat(begin - (np.cumsum(keep) - keep), keep) + np.arange(len(kept))
        ids[dst] = kept
        ids[begin + keep] = sep_id
        if s:
            types[dst] = 1
            types[begin + keep] = 1
        begin = begin + keep + 1
    return ids, out_len, types


# --- compiled tokenizer models, cached ----------------------------------------------------
def model_cache_dir() -> Path | None:
    """Local folder of compiled tokenizer models: $BERTFLOW_TOKENIZER_CACHE if set (empty:
    no disk cache), else $XDG_CACHE_HOME/bertflow/tokenizer or ~/.cache/bertflow/tokenizer."""
    configured = os.environ.get(MODEL_CACHE_ENV)
    if configured is not None:
        return Path(configured) if configured else None
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "bertflow" / "tokenizer"


def model_builders():
    """tensorflow_text's builders of FastBertTokenizer's compiled models, or None.

    They live in the private `tensorflow_text.core.pybinds`. Why use them: building the
    models once per vocabulary and caching them on disk, then handing them to TensorFlow as
    a numpy buffer, saves the tokenize worker both builds (wordpiece model, normalizer) at
    every start (see the module docstring). The version is pinned (requirements.txt:
    tensorflow-text 2.21.x; the TPU
    image's lock: 2.20.x). If a release moves them, this returns None and the encoder passes
    the vocabulary to the public `FastBertTokenizer(vocab=...)` instead: same token ids
    (tests/test_tokenize.py checks it), only a slower start.
    """
    try:
        from tensorflow_text.core.pybinds import (
            pywrap_fast_bert_normalizer_model_builder as normalizer,
            pywrap_fast_wordpiece_tokenizer_model_builder as wordpiece)

        return wordpiece.build_fast_wordpiece_model, normalizer.build_fast_bert_normalizer_model
    except (ImportError, AttributeError):
        return None


def tokenizer_models(vocab: list[str]) -> tuple[bytes, bytes] | None:
    """(fast-wordpiece model, fast BERT normalizer model) flatbuffers for FastBertTokenizer
    (the normalizer's casing is always off: wordpiece_normalizer.py does the casing),
    or None when tensorflow_text's builders are not where this version expects them.

    Keyed by a hash of the vocab, the options and the tensorflow-text version; looked up in
    this process, then in `model_cache_dir()` (checksummed, written atomically; any problem
    there just means building again), then built.
    """
    settings = {"format": 2, "tensorflow_text": tf_text.__version__, **_WORDPIECE}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode() + b"\0"
                         + "\n".join(vocab).encode()).hexdigest()
    if key in _models:
        return _models[key]
    folder = model_cache_dir()
    models = _read_cached_models(folder / f"{key}.bin") if folder else None
    if models is None:
        builders = model_builders()
        if builders is None:
            return None
        build_wordpiece, build_normalizer = builders
        models = (
            build_wordpiece(
                vocab, _WORDPIECE["max_bytes_per_word"], _WORDPIECE["suffix_indicator"],
                _WORDPIECE["unknown_token"], _WORDPIECE["no_pretokenization"],
                _WORDPIECE["support_detokenization"]),
            build_normalizer(False))
        if folder:
            _write_cached_models(folder / f"{key}.bin", models)
    _models[key] = models
    return models


def _read_cached_models(path: Path) -> tuple[bytes, bytes] | None:
    """File layout: sha256(rest) | wordpiece size (8 bytes, little endian) | wordpiece |
    normalizer."""
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    digest, body = blob[:32], blob[32:]
    if len(blob) < 40 or hashlib.sha256(body).digest() != digest:
        return None
    size = int.from_bytes(body[:8], "little")
    if size > len(body) - 8:
        return None
    return body[8:8 + size], body[8 + size:]


def _write_cached_models(path: Path, models: tuple[bytes, bytes]) -> None:
    wordpiece, normalizer = models
    body = len(wordpiece).to_bytes(8, "little") + wordpiece + normalizer
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{id(models)}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(hashlib.sha256(body).digest() + body)
        os.replace(tmp, path)
    except OSError:  # read-only home, full disk...: the cache is only an optimization
        tmp.unlink(missing_ok=True)


def _uint8_tensor(buffer: bytes) -> tf.Tensor:
    return tf.constant(np.frombuffer(buffer, dtype=np.uint8))


# --- the step ----------------------------------------------------------------------------
