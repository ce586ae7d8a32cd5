"""Tokenize step: prepared JSON Lines -> sharded TFRecords, cached by content.

`BertTextEncoder` is the single tokenizer of the project: this step uses it to write the
TFRecords and the export step embeds it in the SavedModel, so serving cannot drift from
training. (The step takes the encoder's wordpieces and truncation rule as they are and only
adds [CLS]/[SEP] in numpy, `BertTextEncoder.encode_numpy`; tests check it equals the
TensorFlow path.) No Python runs per row, and the output is byte-identical for identical
input -- also to the earlier tf.io.encode_proto + tf.io.TFRecordWriter implementation, so
ENCODER_VERSION and existing caches still hold.

Cache: `{artifact_root}/cache/tfrecords/{content_hash}/` holds the shards and a
`manifest.json`. It is built in a local temporary folder and published as a whole; a cache
counts as complete only when its manifest and every shard it lists exist, so an interrupted
upload is rebuilt rather than trusted.

Speed. "Whole step" time is the wall time of `run(cfg, ctx)` on a cache miss, in a process
that has already imported this module (Python/TensorFlow imports not counted): read the data
manifest and the prepared JSON Lines bytes, hash them with the vocab, build the encoder,
tokenize, serialize the tf.train.Example records, frame and write the TFRecord shards,
publish the cache folder, write the step manifest. What keeps it short:
- the tokenizer's compiled models (fast-wordpiece flatbuffer of the vocab: ~0.3-0.4 s for
  30k tokens; BERT normalizer: up to ~1 s the first time in a process) are built once per
  (vocab, options, tensorflow-text version) and kept in memory and in a local disk cache
  (`model_cache_dir()`), and handed to TensorFlow as a numpy buffer (tensorflow_text would
  otherwise convert the 1.7 MB model through a Python list of ints);
- rows are cut into chunks (each within one shard) that worker threads tokenize eagerly (no
  tf.data, no tracing; the TensorFlow kernels release the GIL) and serialize with numpy:
  vectorized varints, TFRecord framing (length, masked CRC32C of the length, Example bytes,
  masked CRC32C of the bytes) into one buffer per chunk, which the main thread appends to
  its shard file in order.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from operator import attrgetter
from pathlib import Path

import google_crc32c
import msgspec
import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text
from tensorflow_text.core.pybinds import pywrap_fast_bert_normalizer_model_builder
from tensorflow_text.core.pybinds import pywrap_fast_wordpiece_tokenizer_model_builder

from tasks import checkpoint, runlayout, storage
from tasks.config import RunConfig, join_uri
from tasks.runlayout import RunContext

# Part of the cache key: bump when the encoder or the record layout changes.
ENCODER_VERSION = "bertflow-fastbert-1"
SPLITS = ("train", "eval")
CACHE_MANIFEST = "manifest.json"
_CHUNK_ROWS = 8192  # rows per chunk: bounds memory, gives the threads work to share

_STRINGS = tf.TensorSpec([None], tf.string)

# tensorflow_text's FastBertTokenizer defaults, which the compiled model bakes in.
_WORDPIECE = {"suffix_indicator": "##", "max_bytes_per_word": 100, "unknown_token": "[UNK]",
              "no_pretokenization": False, "support_detokenization": False}
MODEL_CACHE_ENV = "BERTFLOW_TOKENIZER_CACHE"  # folder; empty string disables the disk cache
_models: dict[str, tuple[bytes, bytes]] = {}


class BertTextEncoder(tf.Module):
    """Raw strings -> BERT input ids, in-graph and exportable in a SavedModel.

    Matches `transformers.BertTokenizerFast(do_lower_case=True)` token for token, including
    truncation: single texts keep their first max_seq_length - 2 tokens; pairs are cut like
    Hugging Face's 'longest_first' (when both segments must shrink, the budget is split evenly
    and an odd token goes to the longer, or to the second when they tie). tensorflow_text's
    ShrinkLongestTrimmer breaks that tie the other way, so the rule is computed here.
    """

    def __init__(self, vocab_path, lower_case: bool = True, max_seq_length: int = 128):
        super().__init__(name="bert_text_encoder")
        text = storage.read_text(str(vocab_path))
        vocab = text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")
        self.vocab_size = len(vocab)
        self.lower_case = lower_case
        self.max_seq_length = max_seq_length
        self._cls_id = vocab.index("[CLS]")
        self._sep_id = vocab.index("[SEP]")
        # The vocabulary is compiled into a constant the traced functions capture, so a
        # SavedModel holding this module needs no vocab file at serving time.
        wordpiece, normalizer = tokenizer_models(vocab, lower_case)
        self._tokenizer = tf_text.FastBertTokenizer(
            token_out_type=tf.int64,
            fast_wordpiece_model_buffer=_uint8_tensor(wordpiece),
            fast_bert_normalizer_model_buffer=_uint8_tensor(normalizer))

    def __call__(self, texts, pairs=None):
        """(input_ids, token_type_ids) as int64 RaggedTensors [batch, (tokens)]."""
        if pairs is None:
            return self.encode(texts)
        return self.encode_pair(texts, pairs)

    @tf.function(input_signature=[_STRINGS])
    def encode(self, texts):
        ids, types, _ = self.encode_with_lengths(texts)
        return ids, types

    @tf.function(input_signature=[_STRINGS, _STRINGS])
    def encode_pair(self, texts, pairs):
        ids, types, _ = self.encode_with_lengths(texts, pairs)
        return ids, types

    def encode_with_lengths(self, texts, pairs=None):
        """Like __call__, plus each row's length before truncation (with [CLS]/[SEP])."""
        first = self.wordpieces(texts)
        if pairs is None:
            untruncated = first.row_lengths() + 2
            keep = _keep_lengths([first.row_lengths()], self.max_seq_length, tf)
            segments = [_head(first, keep[0])]
        else:
            second = self.wordpieces(pairs)
            untruncated = first.row_lengths() + second.row_lengths() + 3
            keep = _keep_lengths([first.row_lengths(), second.row_lengths()],
                                 self.max_seq_length, tf)
            segments = [_head(first, keep[0]), _head(second, keep[1])]
        ids, types = tf_text.combine_segments(
            segments, start_of_sequence_id=self._cls_id, end_of_segment_id=self._sep_id)
        return ids, tf.cast(types, tf.int64), untruncated

    def wordpieces(self, texts) -> tf.RaggedTensor:
        """Token ids of each text, before truncation and without [CLS]/[SEP]."""
        return self._tokenizer.tokenize(texts)

    def encode_numpy(self, texts, pairs=None):
        """encode_with_lengths for the tokenize step, as numpy arrays: (flat input ids, row
        lengths, flat token type ids, pre-truncation lengths).

        Same wordpieces (same op) and the same truncation rule (`_keep_lengths`); only the
        [CLS]/[SEP] assembly is done in numpy instead of TensorFlow ops, which in a fresh
        process cost ~3 ms each to instantiate (~0.2 s for the ~50 of them) and are several
        times slower than numpy on int64 vectors. tests/test_tokenize.py checks both paths
        give identical output.
        """
        segments = []
        for batch in (texts,) if pairs is None else (texts, pairs):
            rt = self.wordpieces(tf.constant(batch, dtype=tf.string))
            segments.append((rt.flat_values.numpy(), rt.row_lengths().numpy()))
        keep = _keep_lengths([lengths for _, lengths in segments], self.max_seq_length, np)
        untruncated = sum(lengths for _, lengths in segments) + len(segments) + 1
        ids, lengths, types = _combine_numpy(
            [(values, lengths, k) for (values, lengths), k in zip(segments, keep)],
            self._cls_id, self._sep_id)
        return ids, lengths, types, untruncated


def _head(rt: tf.RaggedTensor, keep: tf.Tensor) -> tf.RaggedTensor:
    """The first keep[i] items of each row i."""
    starts = rt.row_starts()
    positions = tf.ragged.range(starts, starts + keep).values
    return tf.RaggedTensor.from_row_lengths(tf.gather(rt.values, positions), keep)


def _keep_lengths(lengths: list, max_seq_length: int, xp) -> list:
    """Tokens each segment keeps (xp: tf or np, the same rule for both).

    One segment keeps its first max_seq_length - 2 tokens. Two segments are cut like
    Hugging Face tokenizers' LongestFirst, vectorized over rows: if the shorter segment fits
    in half the budget it stays whole and the longer one takes the rest; otherwise both get
    half, the odd token going to the longer one (to the second when they tie).
    """
    if len(lengths) == 1:
        return [xp.minimum(lengths[0], max_seq_length - 2)]
    len_a, len_b = lengths
    budget = max_seq_length - 3
    short = xp.minimum(len_a, len_b)
    short_whole = 2 * short <= budget
    keep_short = xp.where(short_whole, short, budget // 2)
    keep_long = xp.where(short_whole, budget - short, budget - budget // 2)
    a_longer = len_a > len_b
    keep_a = xp.minimum(len_a, xp.where(a_longer, keep_long, keep_short))
    keep_b = xp.minimum(len_b, xp.where(a_longer, keep_short, keep_long))
    return [keep_a, keep_b]


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


def tokenizer_models(vocab: list[str], lower_case: bool) -> tuple[bytes, bytes]:
    """(fast-wordpiece model, fast BERT normalizer model) flatbuffers for FastBertTokenizer.

    Keyed by a hash of the vocab, the options and the tensorflow-text version; looked up in
    this process, then in `model_cache_dir()` (checksummed, written atomically; any problem
    there just means building again), then built.
    """
    settings = {"format": 1, "tensorflow_text": tf_text.__version__,
                "lower_case": bool(lower_case), **_WORDPIECE}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode() + b"\0"
                         + "\n".join(vocab).encode()).hexdigest()
    if key in _models:
        return _models[key]
    folder = model_cache_dir()
    models = _read_cached_models(folder / f"{key}.bin") if folder else None
    if models is None:
        models = (
            pywrap_fast_wordpiece_tokenizer_model_builder.build_fast_wordpiece_model(
                vocab, _WORDPIECE["max_bytes_per_word"], _WORDPIECE["suffix_indicator"],
                _WORDPIECE["unknown_token"], _WORDPIECE["no_pretokenization"],
                _WORDPIECE["support_detokenization"]),
            pywrap_fast_bert_normalizer_model_builder.build_fast_bert_normalizer_model(
                bool(lower_case)))
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


# --- tf.train.Example serialization and TFRecord framing, vectorized ----------------------
# Layout of one record (every length a varint; fields in this order, as tf.io.encode_proto
# wrote them): Example{1: Features{1: FeatureEntry{1: key, 2: Feature{3: Int64List{1: packed
# values}}}} x (input_ids, token_type_ids, label)}.
_KEYS = (b"input_ids", b"token_type_ids", b"label")
_MASK_DELTA = np.uint32(0xA282EAD8)


def serialize_examples(input_ids, token_type_ids, labels) -> list[bytes]:
    """Serialized tf.train.Example protos (int64 features input_ids, token_type_ids, label).

    input_ids / token_type_ids: RaggedTensors (or nested lists) of the same row lengths;
    labels: one int per row. Same bytes as protobuf/tf.io.encode_proto for non-empty rows (the
    step's rows always hold [CLS] and [SEP]); an empty row is written as an empty packed list,
    which parses the same.
    """
    ids, lengths = _ragged_parts(input_ids)
    types, type_lengths = _ragged_parts(token_type_ids)
    if not np.array_equal(lengths, type_lengths):
        raise ValueError("input_ids and token_type_ids must have the same row lengths")
    buf, starts = _example_records(ids, lengths, types, np.asarray(labels, np.int64).ravel(),
                                   framed=False)
    data = buf.tobytes()
    return [data[a:b] for a, b in zip(starts[:-1].tolist(), starts[1:].tolist())]


def _ragged_parts(values) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(values, tf.RaggedTensor):
        values = tf.ragged.constant(values, dtype=tf.int64)
    return values.flat_values.numpy(), values.row_lengths().numpy()


def _varint_sizes(v: np.ndarray) -> np.ndarray:
    """Bytes of each uint64 as a protobuf varint (int64 < 0 viewed as uint64 take 10)."""
    sizes = np.ones(v.shape, np.int64)
    top = int(v.max()) if v.size else 0
    k = 1
    while k < 10 and top >> (7 * k):
        sizes += v >= np.uint64(1 << (7 * k))
        k += 1
    return sizes


def _varint_block(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bytes [len, width], sizes [len]): row i's first sizes[i] bytes are values[i] as a
    varint (values: int64, negatives as their uint64 two's complement, like protobuf)."""
    v = np.ascontiguousarray(values, np.int64).view(np.uint64)
    sizes = _varint_sizes(v)
    width = int(sizes.max()) if sizes.size else 1
    block = np.empty((len(v), width), np.uint8)
    for j in range(width):
        byte = ((v >> np.uint64(7 * j)) & np.uint64(0x7F)).astype(np.uint8)
        if j + 1 < width:
            byte |= (sizes > j + 1).astype(np.uint8) << 7
        block[:, j] = byte
    return block, sizes


def _packed_varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(all values as consecutive varints, sizes)."""
    if not values.size:
        return np.zeros(0, np.uint8), np.zeros(0, np.int64)
    low, high = int(values.min()), int(values.max())
    if 0 <= low and high < 128:
        return values.astype(np.uint8), np.ones(values.shape, np.int64)
    if 0 <= low and high < 1 << 20:  # e.g. token ids: look the varints up in a table
        table, table_sizes = _varint_block(np.arange(high + 1))
        words = np.zeros((high + 1, 4), np.uint8)  # <= 3 bytes each, gathered as uint32
        words[:, :table.shape[1]] = table
        block = words.view("<u4").ravel()[values].view(np.uint8).reshape(-1, 4)
        sizes = table_sizes[values]
    else:
        block, sizes = _varint_block(values)
    return block[np.arange(block.shape[1]) < sizes[:, None]], sizes


def _packed_rows(n: int, parts: list) -> tuple[np.ndarray, np.ndarray]:
    """Per-row byte strings made of `parts` (constant bytes, [n, width] uint8 arrays used
    whole, or int64 arrays [n] written as varints), concatenated over rows:
    (bytes, row sizes)."""
    blocks = [part if isinstance(part, bytes) or part.dtype == np.uint8 else _varint_block(part)
              for part in parts]
    width = sum(len(b) if isinstance(b, bytes) else
                b.shape[1] if isinstance(b, np.ndarray) else b[0].shape[1] for b in blocks)
    matrix = np.empty((n, width), np.uint8)
    used = np.ones((n, width), bool)
    sizes = np.zeros(n, np.int64)
    col = 0
    for b in blocks:
        if isinstance(b, bytes):
            matrix[:, col:col + len(b)] = np.frombuffer(b, np.uint8)
            sizes += len(b)
            col += len(b)
        elif isinstance(b, np.ndarray):
            matrix[:, col:col + b.shape[1]] = b
            sizes += b.shape[1]
            col += b.shape[1]
        else:
            block, block_sizes = b
            w = block.shape[1]
            matrix[:, col:col + w] = block
            if w > 1:
                used[:, col + 1:col + w] = np.arange(1, w) < block_sizes[:, None]
            sizes += block_sizes
            col += w
    return matrix[used], sizes


def _place(out: np.ndarray, pieces: np.ndarray, sizes: np.ndarray, at: np.ndarray) -> None:
    """Row i's piece (pieces holds them back to back, sizes[i] bytes each) -> out[at[i]:]."""
    index_type = np.int32 if len(out) < 2 ** 31 else np.int64
    starts = np.cumsum(sizes) - sizes
    index = np.repeat((at - starts).astype(index_type), sizes)
    index += np.arange(len(index), dtype=index_type)
    out[index] = pieces


def _example_records(ids: np.ndarray, lengths: np.ndarray, types: np.ndarray,
                     labels: np.ndarray, framed: bool) -> tuple[np.ndarray, np.ndarray]:
    """Records of a batch of rows in one uint8 buffer, record i at [starts[i], starts[i + 1]).

    framed: each record is a TFRecord (8-byte length, its masked CRC32C, the Example, the
    Example's masked CRC32C), so a run of records is a valid TFRecord file as it stands.
    Built as per-record header strings and the packed id/type varints, interleaved.
    """
    n = len(lengths)
    lengths = np.asarray(lengths, np.int64)
    splits = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=splits[1:])
    id_bytes, id_sizes = _packed_varints(np.asarray(ids, np.int64))
    type_bytes, type_sizes = _packed_varints(np.asarray(types, np.int64))
    labels = np.asarray(labels, np.int64)
    label_sizes = _varint_sizes(labels.view(np.uint64))

    def nested(key: bytes, payload: np.ndarray):
        """(payload size, Int64List size, Feature size, FeatureEntry size) per row."""
        int64_list = 1 + _varint_sizes(payload.view(np.uint64)) + payload
        feature = 1 + _varint_sizes(int64_list.view(np.uint64)) + int64_list
        entry = 3 + len(key) + _varint_sizes(feature.view(np.uint64)) + feature
        return [payload, int64_list, feature, entry]

    ends = np.zeros(len(id_sizes) + 1, np.int64)
    np.cumsum(id_sizes, out=ends[1:])
    sizes = [nested(_KEYS[0], ends[splits[1:]] - ends[splits[:-1]])]
    ends = np.zeros(len(type_sizes) + 1, np.int64)
    np.cumsum(type_sizes, out=ends[1:])
    sizes.append(nested(_KEYS[1], ends[splits[1:]] - ends[splits[:-1]]))
    sizes.append(nested(_KEYS[2], label_sizes))
    features = sum(1 + _varint_sizes(s[3].view(np.uint64)) + s[3] for s in sizes)
    features = np.asarray(features, np.int64)
    example = 1 + _varint_sizes(features.view(np.uint64)) + features

    def header(k: int) -> list:
        payload, int64_list, feature, entry = sizes[k]
        key = _KEYS[k]
        return [b"\x0a", entry, b"\x0a" + bytes([len(key)]) + key + b"\x12", feature,
                b"\x1a", int64_list, b"\x0a", payload]

    framing = []
    if framed:
        framing = [example.astype("<u8").view(np.uint8).reshape(n, 8),
                   _length_crcs(example).astype("<u4").view(np.uint8).reshape(n, 4)]
    pieces = [_packed_rows(n, framing + [b"\x0a", features] + header(0)),
              (id_bytes, sizes[0][0]),
              _packed_rows(n, header(1)),
              (type_bytes, sizes[1][0]),
              _packed_rows(n, header(2) + [labels])]
    record = example + (16 if framed else 0)
    starts = np.zeros(n + 1, np.int64)
    np.cumsum(record, out=starts[1:])
    out = np.empty(int(starts[-1]), np.uint8)
    at = starts[:-1].copy()
    for piece, piece_sizes in pieces:
        _place(out, piece, piece_sizes, at)
        at += piece_sizes
    if framed and n:
        data = out.tobytes()
        value = google_crc32c.value
        crcs = _masked_crc([value(data[a:b]) for a, b in zip((starts[:-1] + 12).tolist(),
                                                             at.tolist())])
        out[at[:, None] + np.arange(4)] = crcs.astype("<u4").view(np.uint8).reshape(n, 4)
    return out, starts


def _length_crcs(example: np.ndarray) -> np.ndarray:
    """Masked CRC32C of each record's 8-byte little-endian length (few distinct lengths)."""
    table = np.zeros(int(example.max()) + 1 if example.size else 0, np.uint32)
    distinct = np.flatnonzero(np.bincount(example, minlength=len(table)))
    table[distinct] = _masked_crc([google_crc32c.value(s.to_bytes(8, "little"))
                                   for s in distinct.tolist()])
    return table[example]


def _masked_crc(crcs: list[int]) -> np.ndarray:
    """TFRecord's CRC masking: rotate right by 15 bits, add a constant (mod 2**32)."""
    c = np.array(crcs, np.uint32)
    return ((c >> np.uint32(15)) | (c << np.uint32(17))) + _MASK_DELTA


# --- the step ----------------------------------------------------------------------------
def run(cfg: RunConfig, ctx: RunContext) -> str:
    """Tokenize the prepared splits (or reuse the cache); return the manifest URI."""
    data = runlayout.read_manifest(ctx.manifest_uri("data"))
    vocab_file = checkpoint.vocab_path(checkpoint.resolve_base_model(cfg))
    split_bytes = {name: storage.read_bytes(data["splits"][name]["uri"]) for name in SPLITS}
    content_hash = _content_hash(split_bytes, vocab_file.read_bytes(), cfg)
    cache = runlayout.cache_uri(cfg.artifact_root, content_hash)

    cached = _complete_cache_manifest(cache)
    reused = cached is not None
    if not reused:
        encoder = BertTextEncoder(vocab_file, cfg.lower_case, cfg.max_seq_length)
        cached = _build_cache(cache, content_hash, encoder, split_bytes, cfg.num_shards)

    manifest = {
        "content_hash": content_hash,
        "cache_uri": cache,
        "reused": reused,
        "vocab_size": cached["vocab_size"],
        "max_seq_length": cached["max_seq_length"],
        "lower_case": cached["lower_case"],
        "has_pair": data["has_pair"],
        "labels": data["labels"],
        "splits": {name: {**split, "shards": [join_uri(cache, s) for s in split["shards"]]}
                   for name, split in cached["splits"].items()},
    }
    return runlayout.write_manifest(ctx.step_uri("tokenize"), manifest)


def _content_hash(split_bytes: dict[str, bytes], vocab: bytes, cfg: RunConfig) -> str:
    digest = hashlib.sha256()
    settings = {"encoder": ENCODER_VERSION, "max_seq_length": cfg.max_seq_length,
                "lower_case": cfg.lower_case, "num_shards": cfg.num_shards}
    for part in (json.dumps(settings, sort_keys=True).encode(), vocab,
                 split_bytes["train"], split_bytes["eval"]):
        # Length-prefixed so that moving bytes between parts changes the hash.
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def _complete_cache_manifest(cache: str) -> dict | None:
    manifest_uri = join_uri(cache, CACHE_MANIFEST)
    if not storage.exists(manifest_uri):
        return None
    manifest = storage.read_json(manifest_uri)
    shards = [s for split in manifest["splits"].values() for s in split["shards"]]
    if not all(storage.exists(join_uri(cache, s)) for s in shards):
        return None
    return manifest


def _build_cache(cache: str, content_hash: str, encoder: BertTextEncoder,
                 split_bytes: dict[str, bytes], num_shards: int) -> dict:
    prepared = {name: _read_prepared(split_bytes[name]) for name in SPLITS}
    has_pair = prepared[SPLITS[-1]][1] is not None
    with tempfile.TemporaryDirectory(prefix="bertflow-tokenize-") as tmp:
        shards = _write_shards(Path(tmp), encoder, prepared, num_shards)
        splits = {}
        for name in SPLITS:
            names, lengths, untruncated = shards[name]
            splits[name] = {
                "shards": names,
                "num_examples": len(prepared[name][2]),
                "num_truncated": int(np.sum(untruncated > encoder.max_seq_length)),
                "length_histogram": _histogram(lengths, encoder.max_seq_length),
            }
        manifest = {"content_hash": content_hash, "encoder_version": ENCODER_VERSION,
                    "vocab_size": encoder.vocab_size, "max_seq_length": encoder.max_seq_length,
                    "lower_case": encoder.lower_case, "has_pair": has_pair,
                    "num_shards": num_shards, "splits": splits}
        storage.write_json(str(Path(tmp) / CACHE_MANIFEST), manifest)
        if storage.exists(cache) and _complete_cache_manifest(cache) is None:
            storage.delete_prefix(cache)  # leftovers of an interrupted publish
        if not storage.publish_dir(Path(tmp), cache):
            # Another run published the same content meanwhile; it is identical.
            return storage.read_json(join_uri(cache, CACHE_MANIFEST))
    return manifest


class _Row(msgspec.Struct):
    text: str
    label: int
    text_pair: str | None = None


_ROWS = msgspec.json.Decoder(_Row)


def _read_prepared(data: bytes):
    """(texts, pairs or None, labels) from a data-step JSON Lines file, parsed in one call."""
    rows = _ROWS.decode_lines(data)
    texts = list(map(attrgetter("text"), rows))
    pairs = (list(map(attrgetter("text_pair"), rows))
             if rows and rows[0].text_pair is not None else None)
    labels = np.array(list(map(attrgetter("label"), rows)), dtype=np.int64)
    return texts, pairs, labels


def _write_shards(folder: Path, encoder: BertTextEncoder, prepared: dict,
                  num_shards: int) -> dict:
    """Write every split's shards: {split: (shard names, stored lengths, pre-truncation
    lengths)}. Shard k of a split holds a contiguous, near-equal row range (file order
    preserved); each is cut into chunks of at most _CHUNK_ROWS rows, which worker threads
    tokenize while this thread serializes them and appends them to the files in order."""
    chunks, names = [], {}
    for split, (texts, _, _) in prepared.items():
        names[split] = [f"{split}-{k:05d}-of-{num_shards:05d}.tfrecord"
                        for k in range(num_shards)]
        bounds = np.linspace(0, len(texts), num_shards + 1).astype(int).tolist()
        for k in range(num_shards):
            (folder / names[split][k]).touch()
            pieces = math.ceil((bounds[k + 1] - bounds[k]) / _CHUNK_ROWS)
            cuts = np.linspace(bounds[k], bounds[k + 1], pieces + 1).astype(int).tolist()
            chunks += [(split, k, a, b) for a, b in zip(cuts[:-1], cuts[1:])]

    def tokenize(chunk):
        split, _, a, b = chunk
        texts, pairs, _ = prepared[split]
        return encoder.encode_numpy(texts[a:b], None if pairs is None else pairs[a:b])

    # Worker threads tokenize up to 2 chunks each ahead (GIL-free kernels); this thread
    # serializes (GIL-bound: many small numpy calls, a CRC32C call per record) and writes.
    done = {split: ([], []) for split in prepared}
    workers = _cpu_count()
    ahead = 2 * workers
    with ThreadPoolExecutor(workers) as pool:
        pending = deque((c, pool.submit(tokenize, c)) for c in chunks[:ahead])
        for i in range(len(chunks)):
            (split, k, a, b), future = pending.popleft()
            if i + ahead < len(chunks):
                pending.append((chunks[i + ahead], pool.submit(tokenize, chunks[i + ahead])))
            ids, lengths, types, untruncated = future.result()
            records, _ = _example_records(ids, lengths, types, prepared[split][2][a:b],
                                          framed=True)
            with open(folder / names[split][k], "ab") as f:
                f.write(records.data)
            done[split][0].append(lengths)
            done[split][1].append(untruncated)
    empty = np.zeros(0, np.int64)
    return {split: (names[split], np.concatenate(done[split][0] or [empty]),
                    np.concatenate(done[split][1] or [empty])) for split in prepared}


def _cpu_count() -> int:
    try:
        return max(1, min(len(os.sched_getaffinity(0)), 8))
    except AttributeError:
        return max(1, min(os.cpu_count() or 1, 8))


def _histogram(lengths: np.ndarray, max_seq_length: int) -> dict:
    """Counts of stored sequence lengths in bins [edges[i], edges[i+1])."""
    edges = [0] + [2 ** k for k in range(3, 10) if 2 ** k < max_seq_length] + [
        max_seq_length + 1]
    counts, _ = np.histogram(lengths, bins=edges)
    return {"edges": edges, "counts": counts.tolist()}
