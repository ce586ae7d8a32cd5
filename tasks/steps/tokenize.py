"""Tokenize step: prepared JSON Lines shards -> sharded TFRecords, cached by content.

`BertTextEncoder` is the single tokenizer of the project: this step uses it to write the
TFRecords and the export step embeds it in the SavedModel, so serving cannot drift from
training. (The step takes the encoder's wordpieces and truncation rule as they are and only
adds [CLS]/[SEP] in numpy, `BertTextEncoder.encode_numpy`; tests check it equals the
TensorFlow path.) No Python runs per row, and the output is byte-identical for identical
input -- also to tf.io.encode_proto + tf.io.TFRecordWriter (`tasks/io/tfrecord_io.py`), so
ENCODER_VERSION and existing caches still hold.

Bounded memory: the prepared shards are hashed block by block for the cache key (the same
value as hashing each split's bytes whole), then read in _READ_BLOCK blocks and cut into
chunks of at most _CHUNK_ROWS rows, each within one output shard; a few chunks are in flight
at a time and each is appended to its shard file as soon as it is serialized. Statistics
(truncation count, length histogram) are accumulated per chunk.

Cache: `{artifact_root}/cache/tfrecords/{content_hash}/` holds the shards and a
`manifest.json`. It is built in a local temporary folder and published as a whole; a cache
counts as complete only when its manifest and every shard it lists exist, so an interrupted
upload is rebuilt rather than trusted.

Speed. What keeps the step short:
- the tokenizer's compiled models (fast-wordpiece flatbuffer of the vocab: ~0.3-0.4 s for
  30k tokens; BERT normalizer: up to ~1 s the first time in a process) are built once per
  (vocab, options, tensorflow-text version) and kept in memory and in a local disk cache
  (`model_cache_dir()`), and handed to TensorFlow as a numpy buffer (tensorflow_text would
  otherwise convert the 1.7 MB model through a Python list of ints);
- worker threads tokenize chunks eagerly (no tf.data, no tracing; the TensorFlow kernels
  release the GIL) while the main thread serializes them with numpy (`tasks/io/tfrecord_io.py`:
  vectorized varints and TFRecord framing into one buffer per chunk) and appends them to
  their shard files in order.
"""
from __future__ import annotations

import hashlib
import json
import itertools
import os
import tempfile
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from operator import attrgetter
from pathlib import Path

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

from tasks.training import checkpoint
from tasks.runs import runlayout
from tasks.io import storage
from tasks.steps import data as data_step
from tasks.io import tfrecord_io
from tasks.errors import BertflowError
from tasks.io.tfrecord_io import example_records as _example_records  # noqa: F401
from tasks.io.tfrecord_io import serialize_examples  # noqa: F401
from tasks.config import RunConfig
from tasks.io.uris import join_uri
from tasks.runs.runlayout import RunContext
from tasks.task_kinds import kind as task_kind

# Part of the cache key: bump when the encoder or the record layout changes.
ENCODER_VERSION = "bertflow-fastbert-1"
SPLITS = ("train", "eval")
CACHE_MANIFEST = "manifest.json"
_CHUNK_ROWS = 8192  # rows per chunk: bounds memory, gives the threads work to share
_READ_BLOCK = 4 << 20  # bytes per read of the prepared shards

_STRINGS = tf.TensorSpec([None], tf.string)

# tensorflow_text's FastBertTokenizer defaults, which the compiled model bakes in.
_WORDPIECE = {"suffix_indicator": "##", "max_bytes_per_word": 100, "unknown_token": "[UNK]",
              "no_pretokenization": False, "support_detokenization": False}
MODEL_CACHE_ENV = "BERTFLOW_TOKENIZER_CACHE"  # folder; empty string disables the disk cache
_models: dict[str, tuple[bytes, bytes]] = {}


class BertTextEncoder(tf.Module):
    """Raw strings -> BERT input ids, in-graph and exportable in a SavedModel.

    Matches `transformers.BertTokenizer(do_lower_case=True)` token for token, including
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
        models = tokenizer_models(vocab, lower_case)
        if models is None:  # tensorflow_text's model builders moved: the public API
            self._tokenizer = tf_text.FastBertTokenizer(
                vocab=vocab, token_out_type=tf.int64, lower_case_nfd_strip_accents=lower_case,
                **{k: v for k, v in _WORDPIECE.items()})
        else:
            wordpiece, normalizer = models
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


def model_builders():
    """tensorflow_text's builders of FastBertTokenizer's compiled models, or None.

    They live in the private `tensorflow_text.core.pybinds`. Why use them: building the
    models once per vocabulary and caching them on disk, then handing them to TensorFlow as
    a numpy buffer, saves the tokenize worker ~0.3-0.4 s (wordpiece model of a 30k vocab)
    plus up to ~1 s (normalizer, first time in a process) at every start (see the module
    docstring). The version is pinned (requirements.txt: tensorflow-text 2.21.x; the TPU
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


def tokenizer_models(vocab: list[str], lower_case: bool) -> tuple[bytes, bytes] | None:
    """(fast-wordpiece model, fast BERT normalizer model) flatbuffers for FastBertTokenizer,
    or None when tensorflow_text's builders are not where this version expects them.

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
        builders = model_builders()
        if builders is None:
            return None
        build_wordpiece, build_normalizer = builders
        models = (
            build_wordpiece(
                vocab, _WORDPIECE["max_bytes_per_word"], _WORDPIECE["suffix_indicator"],
                _WORDPIECE["unknown_token"], _WORDPIECE["no_pretokenization"],
                _WORDPIECE["support_detokenization"]),
            build_normalizer(bool(lower_case)))
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
def run(cfg: RunConfig, ctx: RunContext) -> str:
    """Tokenize the prepared splits (or reuse the cache); return the manifest URI."""
    data = runlayout.read_manifest(ctx.manifest_uri("data"))
    task = data.get("task", "classification")  # data manifests from before issue 33
    vocab_file = checkpoint.vocab_path(checkpoint.resolve_base_model(cfg))
    content_hash = _content_hash(data["splits"], vocab_file.read_bytes(), cfg,
                                 task, len(data["labels"]))
    cache = runlayout.cache_uri(cfg.artifact_root, content_hash)

    cached = _complete_cache_manifest(cache)
    reused = cached is not None
    if not reused:
        encoder = BertTextEncoder(vocab_file, cfg.lower_case, cfg.max_seq_length)
        cached = _build_cache(cache, content_hash, encoder, data, cfg.num_shards, task)

    manifest = {
        "content_hash": content_hash,
        "cache_uri": cache,
        "reused": reused,
        "vocab_size": cached["vocab_size"],
        "max_seq_length": cached["max_seq_length"],
        "lower_case": cached["lower_case"],
        "has_pair": data["has_pair"],
        "task": task,
        "labels": data["labels"],
        # The TFRecords' `label` feature (tasks.training.inputs parses by it).
        "label_spec": task_kind(task).label_spec(len(data["labels"])),
        "splits": {name: {**split, "shards": [join_uri(cache, s) for s in split["shards"]]}
                   for name, split in cached["splits"].items()},
    }
    return runlayout.write_manifest(ctx.step_uri("tokenize"), manifest)


def _content_hash(splits: dict, vocab: bytes, cfg: RunConfig, task: str = "classification",
                  num_labels: int = 0) -> str:
    """sha256 over the settings, the vocab and each split's prepared bytes (its shards in
    order), streamed block by block; the same value as hashing each split's bytes whole.

    The task decides the label feature (int64 index, float multi-hot of num_labels, float
    score), so it is part of the key; classification leaves it out, which keeps the caches
    written before tasks existed valid."""
    digest = hashlib.sha256()
    settings = {"encoder": ENCODER_VERSION, "max_seq_length": cfg.max_seq_length,
                "lower_case": cfg.lower_case, "num_shards": cfg.num_shards}
    if task != "classification":
        settings.update(task=task, num_labels=num_labels)
    for part in (json.dumps(settings, sort_keys=True).encode(), vocab):
        # Length-prefixed so that moving bytes between parts changes the hash.
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    for name in SPLITS:
        digest.update(splits[name]["num_bytes"].to_bytes(8, "big"))
        size = 0
        for uri in splits[name]["shards"]:
            for block in storage.iter_bytes(uri, _READ_BLOCK):
                digest.update(block)
                size += len(block)
        if size != splits[name]["num_bytes"]:
            raise BertflowError(f"{name} split: the data manifest says {splits[name]['num_bytes']}"
                                f" bytes, its shards hold {size}; run the data step again")
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


def _build_cache(cache: str, content_hash: str, encoder: BertTextEncoder, data: dict,
                 num_shards: int, task: str = "classification") -> dict:
    kind, num_labels = task_kind(task), len(data["labels"])
    with tempfile.TemporaryDirectory(prefix="bertflow-tokenize-") as tmp:
        splits = _write_shards(Path(tmp), encoder, data["splits"], num_shards,
                               lambda values: kind.record_labels(values, num_labels))
        manifest = {"content_hash": content_hash, "encoder_version": ENCODER_VERSION,
                    "vocab_size": encoder.vocab_size, "max_seq_length": encoder.max_seq_length,
                    "lower_case": encoder.lower_case, "has_pair": data["has_pair"],
                    "num_shards": num_shards, "splits": splits}
        storage.write_json(str(Path(tmp) / CACHE_MANIFEST), manifest)
        if storage.exists(cache) and _complete_cache_manifest(cache) is None:
            storage.delete_prefix(cache)  # leftovers of an interrupted publish
        if not storage.publish_dir(Path(tmp), cache):
            # Another run published the same content meanwhile; it is identical.
            return storage.read_json(join_uri(cache, CACHE_MANIFEST))
    return manifest


def _int_labels(values: list) -> np.ndarray:
    return np.array(values, np.int64)


def _chunks(split: str, shards: list[str], total: int, bounds: list[int],
            record_labels=_int_labels):
    """(split, output shard k, texts, pairs or None, labels) chunks of the prepared rows in
    file order, each at most _CHUNK_ROWS rows and within one output shard (rows
    [bounds[k], bounds[k+1]) go to shard k), read block by block. `record_labels` turns a
    chunk's prepared labels into the array the records hold (tasks/task_kinds.py)."""
    k, row = 0, 0
    texts, pairs, labels = [], [], []

    def emit():
        chunk = (split, k, texts[:], pairs[:] if pairs and pairs[0] is not None else None,
                 record_labels(labels))
        texts.clear(), pairs.clear(), labels.clear()
        return chunk

    for rows in data_step.read_prepared_rows(shards, _READ_BLOCK):
        i = 0
        while i < len(rows):
            if row >= total:
                break  # more rows than the manifest says: reported below
            while bounds[k + 1] <= row:  # empty shards (fewer rows than shards)
                k += 1
            take = min(len(rows) - i, _CHUNK_ROWS - len(texts), bounds[k + 1] - row)
            part = rows[i:i + take]
            texts.extend(map(attrgetter("text"), part))
            pairs.extend(map(attrgetter("text_pair"), part))
            labels.extend(map(attrgetter("label"), part))
            i += take
            row += take
            if len(texts) == _CHUNK_ROWS or row == bounds[k + 1]:
                yield emit()
        else:
            continue
        row += len(rows) - i
    if texts:
        yield emit()
    if row != total:
        raise BertflowError(f"{split} split: the data manifest says {total} rows, its shards "
                            f"hold {row}; run the data step again")


def _write_shards(folder: Path, encoder: BertTextEncoder, splits: dict,
                  num_shards: int, record_labels=_int_labels) -> dict:
    """Write every split's shards and return their manifest entries. Shard k of a split
    holds a contiguous, near-equal row range (file order preserved). The prepared rows are
    read block by block and cut into chunks of at most _CHUNK_ROWS rows, which worker threads
    tokenize while this thread serializes them and appends them to the shard files in
    order: memory holds a few chunks, whatever the data's size."""
    out = {}
    for split in SPLITS:
        total = splits[split]["num_examples"]
        names = [f"{split}-{k:05d}-of-{num_shards:05d}.tfrecord" for k in range(num_shards)]
        for name in names:
            (folder / name).touch()
        bounds = np.linspace(0, total, num_shards + 1).astype(int).tolist()
        edges = _histogram_edges(encoder.max_seq_length)
        counts = np.zeros(len(edges) - 1, np.int64)
        truncated = 0
        for k, lengths, untruncated in _tokenized(
                encoder, _chunks(split, splits[split]["shards"], total, bounds, record_labels),
                folder, names):
            counts += np.histogram(lengths, bins=edges)[0]
            truncated += int(np.sum(untruncated > encoder.max_seq_length))
        out[split] = {"shards": names, "num_examples": total, "num_truncated": truncated,
                      "length_histogram": {"edges": edges, "counts": counts.tolist()}}
    return out


def _tokenized(encoder: BertTextEncoder, chunks, folder: Path, names: list[str]):
    """Tokenize `chunks` on worker threads (up to 2 chunks each ahead; the TensorFlow kernels
    release the GIL); serialize (GIL-bound numpy) and append each to its shard in order on
    this thread. Yields (shard, stored lengths, pre-truncation lengths) per chunk."""
    workers = _cpu_count()
    ahead = 2 * workers

    def tokenize(chunk):
        _, _, texts, pairs, _ = chunk
        return encoder.encode_numpy(texts, pairs)

    library = (tfrecord_io.LibraryShardWriter()
               if os.environ.get("BERTFLOW_TFRECORD_WRITER") == "library" else None)
    with ThreadPoolExecutor(workers) as pool:
        pending = deque()
        chunks = iter(chunks)
        for chunk in itertools.islice(chunks, ahead):
            pending.append((chunk, pool.submit(tokenize, chunk)))
        while pending:
            chunk, future = pending.popleft()
            following = next(chunks, None)
            if following is not None:
                pending.append((following, pool.submit(tokenize, following)))
            _, k, _, _, labels = chunk
            ids, lengths, types, untruncated = future.result()
            if library is not None and labels.dtype == np.int64:  # int64 labels only
                library.write(folder / names[k], ids, lengths, types, labels)
            else:
                records, _ = _example_records(ids, lengths, types, labels, framed=True)
                with open(folder / names[k], "ab") as f:
                    f.write(records.data)
            yield k, lengths, untruncated
    if library is not None:
        library.close()


def _cpu_count() -> int:
    try:
        return max(1, min(len(os.sched_getaffinity(0)), 8))
    except AttributeError:
        return max(1, min(os.cpu_count() or 1, 8))


def _histogram_edges(max_seq_length: int) -> list[int]:
    """Bins [edges[i], edges[i+1]) of the stored sequence lengths' histogram."""
    return [0] + [2 ** k for k in range(3, 10) if 2 ** k < max_seq_length] + [
        max_seq_length + 1]
