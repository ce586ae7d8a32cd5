"""Tokenize step: prepared JSON Lines shards -> sharded TFRecords, cached by content.

The checkpoint family's text encoder (`checkpoint.text_encoder`: WordPiece's
`BertTextEncoder`, tasks/model/text_encoder.py, RoBERTa's byte-level BPE,
tasks/model/byte_bpe.py, or XLM-R's or DeBERTa-v3's SentencePiece,
tasks/model/sentencepiece_text.py) is the single tokenizer of a run: this step uses it to
write the TFRecords and the export step embeds it in the SavedModel, so serving cannot drift from
training. (The step takes the encoder's wordpieces and truncation rule as they are and only
adds [CLS]/[SEP] in numpy, `SegmentEncoder.encode_numpy`; tests check it equals the
TensorFlow path.) No Python runs per row, and the output is byte-identical for identical
input -- also to tf.io.encode_proto + tf.io.TFRecordWriter (`tasks/io/tfrecord_io.py`), so
the families' encoder versions (tasks/model/families.py) and existing caches still hold.

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
- the tokenizer's compiled models are built once and cached (tasks/model/text_encoder.py);
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

from tasks.training import checkpoint
from tasks.runs import runlayout
from tasks.io import storage
from tasks.steps import prepared, window_data
from tasks.steps.prepared import PreparedRow, TokenRow
from tasks.model.token_encoding import WordPieceAligner
from tasks.io import tfrecord_io
from tasks.errors import BertflowError
from tasks.config import RunConfig
from tasks.io.uris import join_uri
from tasks.runs.runlayout import RunContext
from tasks.task_kinds import kind as task_kind
from tasks.model.config import EncoderConfig
from tasks.model.families import FAMILIES
from tasks.model.text_encoder import SegmentEncoder

SPLITS = ("train", "eval")  # every run's; "validation" follows them when the run has it
OPTIONAL_SPLITS = ("validation",)
CACHE_MANIFEST = "manifest.json"
_CHUNK_ROWS = 8192  # rows per chunk: bounds memory, gives the threads work to share
_READ_BLOCK = 4 << 20  # bytes per read of the prepared shards

def run(cfg: RunConfig, ctx: RunContext) -> str:
    """Tokenize the prepared splits (or reuse the cache); return the manifest URI."""
    data = runlayout.read_manifest(ctx.manifest_uri("data"))
    task = data.get("task", "classification")  # data manifests from before issue 33
    model_dir = checkpoint.resolve_base_model(cfg)
    files = checkpoint.tokenizer_files(model_dir)
    casing = checkpoint.casing(model_dir, cfg)
    version = FAMILIES[EncoderConfig.from_pretrained(model_dir).family].encoder_version
    content_hash = _content_hash(data["splits"], _tokenizer_bytes(files), cfg,
                                 task, len(data["labels"]), casing.lower_case, version,
                                 casing.strip_accents)
    cache = runlayout.cache_uri(cfg.artifact_root, content_hash)

    cached = _complete_cache_manifest(cache)
    reused = cached is not None
    if not reused:
        encoder = checkpoint.text_encoder(model_dir, casing.lower_case, cfg.max_seq_length,
                                          casing.strip_accents)
        cached = _build_cache(cache, content_hash, encoder, data, cfg.num_shards, task,
                              version, cfg.window_stride if cfg.long_text == "window" else None)
    if cfg.long_text == "window":
        train = cached["splits"]["train"]
        print(f"tokenize: {train['num_windowed']} of {train['num_examples']} training texts "
              f"are longer than max_seq_length {cfg.max_seq_length}: {train['num_records']} "
              f"windows in all (overlap {cfg.window_stride} pieces)", flush=True)
    if task_kind(task).per_token and cfg.long_text != "window":
        truncated = cached["splits"]["train"]["num_truncated"]
        print(f"tokenize: max_seq_length {cfg.max_seq_length} cuts {truncated} of "
              f"{cached['splits']['train']['num_examples']} training sentences (their last "
              "words are not learned)", flush=True)

    manifest = {
        "content_hash": content_hash,
        "cache_uri": cache,
        "reused": reused,
        "vocab_size": cached["vocab_size"],
        "max_seq_length": cached["max_seq_length"],
        "lower_case": cached["lower_case"],
        "lower_case_rule": casing.rule,  # which rule decided (tasks/model/casing.py)
        # Set apart from lower_case by the checkpoint, else None (caches before: absent).
        "strip_accents": cached.get("strip_accents"),
        "has_pair": data["has_pair"],
        "task": task,
        "labels": data["labels"],
        # The TFRecords' `label` feature (tasks.training.inputs parses by it).
        "label_spec": {**task_kind(task).label_spec(len(data["labels"])),
                       **(window_data.window_spec(task_kind(task))
                          if cfg.long_text == "window" else {})},
        "long_text": cfg.long_text,
        **({"window_stride": cfg.window_stride} if cfg.long_text == "window" else {}),
        "splits": {name: {**split, "shards": [join_uri(cache, s) for s in split["shards"]]}
                   for name, split in cached["splits"].items()},
    }
    return runlayout.write_manifest(ctx.step_uri("tokenize"), manifest)


def _tokenizer_bytes(files: list[Path]) -> bytes:
    """The tokenizer files' bytes for the cache key: vocab.txt's as they are (the key BERT
    caches were made with), several files each length-prefixed."""
    if len(files) == 1:
        return files[0].read_bytes()
    parts = [path.read_bytes() for path in files]
    return b"".join(len(part).to_bytes(8, "big") + part for part in parts)


def _content_hash(splits: dict, vocab: bytes, cfg: RunConfig, task: str, num_labels: int,
                  lower_case: bool, encoder_version: str,
                  strip_accents: bool | None = None) -> str:
    """sha256 over the settings, the vocab and each split's prepared bytes (its shards in
    order), streamed block by block; the same value as hashing each split's bytes whole.

    The task decides the label feature (int64 index, float multi-hot of num_labels, float
    score), so it is part of the key; classification leaves it out, which keeps the caches
    written before tasks existed valid. strip_accents likewise: only where the checkpoint
    sets it apart from lower_case (tasks/model/casing.py)."""
    digest = hashlib.sha256()
    settings = {"encoder": encoder_version, "max_seq_length": cfg.max_seq_length,
                "lower_case": lower_case, "num_shards": cfg.num_shards}
    if task != "classification":
        settings.update(task=task, num_labels=num_labels)
    if strip_accents is not None:
        settings["strip_accents"] = strip_accents
    if cfg.long_text == "window":  # truncating runs keep the key they had before windows
        settings.update(long_text="window", window_stride=cfg.window_stride)
    names = split_names(splits)
    if names != SPLITS:  # two-split runs keep the key they had before validation existed
        settings["splits"] = list(names)
    for part in (json.dumps(settings, sort_keys=True).encode(), vocab):
        # Length-prefixed so that moving bytes between parts changes the hash.
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    for name in names:
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


def split_names(splits: dict) -> tuple[str, ...]:
    """The data manifest's splits in the tokenizer's order: train, eval, then validation."""
    return SPLITS + tuple(name for name in OPTIONAL_SPLITS if name in splits)


def _complete_cache_manifest(cache: str) -> dict | None:
    manifest_uri = join_uri(cache, CACHE_MANIFEST)
    if not storage.exists(manifest_uri):
        return None
    manifest = storage.read_json(manifest_uri)
    shards = [s for split in manifest["splits"].values() for s in split["shards"]]
    if not all(storage.exists(join_uri(cache, s)) for s in shards):
        return None
    return manifest


def _build_cache(cache: str, content_hash: str, encoder: SegmentEncoder, data: dict,
                 num_shards: int, task: str, encoder_version: str,
                 window_stride: int | None = None) -> dict:
    kind, num_labels = task_kind(task), len(data["labels"])
    if kind.per_token:
        codec = _TokenCodec(encoder, window_stride)
    elif window_stride is not None:
        codec = window_data.WindowCodec(
            encoder, window_stride, lambda values: kind.record_labels(values, num_labels))
    else:
        codec = _RowCodec(encoder, lambda values: kind.record_labels(values, num_labels))
    with tempfile.TemporaryDirectory(prefix="bertflow-tokenize-") as tmp:
        splits = _write_shards(Path(tmp), encoder, data["splits"], num_shards, codec)
        manifest = {"content_hash": content_hash, "encoder_version": encoder_version,
                    "vocab_size": encoder.vocab_size, "max_seq_length": encoder.max_seq_length,
                    "lower_case": encoder.lower_case,
                    "strip_accents": encoder.strip_accents, "has_pair": data["has_pair"],
                    "num_shards": num_shards, "splits": splits}
        storage.write_json(str(Path(tmp) / CACHE_MANIFEST), manifest)
        if storage.exists(cache) and _complete_cache_manifest(cache) is None:
            storage.delete_prefix(cache)  # leftovers of an interrupted publish
        if not storage.publish_dir(Path(tmp), cache):
            # Another run published the same content meanwhile; it is identical.
            return storage.read_json(join_uri(cache, CACHE_MANIFEST))
    return manifest


class _RowCodec:
    """Prepared rows of a text (and pair) and a label -> record arrays: the encoder's ids
    (SegmentEncoder.encode_numpy) and `record_labels` of the chunk's labels."""

    row_type = PreparedRow

    def __init__(self, encoder: SegmentEncoder, record_labels=None):
        self.encoder = encoder
        self.record_labels = record_labels or (lambda values: np.array(values, np.int64))

    def encode(self, rows: list) -> tuple:
        """(flat ids, lengths, flat types, untruncated lengths, labels)."""
        texts = list(map(attrgetter("text"), rows))
        pairs = list(map(attrgetter("text_pair"), rows))
        ids, lengths, types, untruncated = self.encoder.encode_numpy(
            texts, pairs if pairs and pairs[0] is not None else None)
        return ids, lengths, types, untruncated, self.record_labels(
            list(map(attrgetter("label"), rows)))


class _TokenCodec:
    """Prepared sentences (words and tag ids) -> record arrays: word pieces with the tag id
    on each word's first piece and IGNORED elsewhere (tasks/model/token_encoding.py); the
    labels are a (flat values, row lengths) pair, one per piece."""

    row_type = TokenRow

    def __init__(self, encoder: SegmentEncoder, window_stride: int | None = None):
        self.aligner = WordPieceAligner(encoder, window_stride)
        self.windowed = window_stride is not None

    def encode(self, rows: list, split: str = "train") -> tuple:
        """With windows, also each window's sentence index in the chunk and its place among
        its sentence's windows; held-out splits label each word in one window only."""
        import tensorflow as tf

        # Flat values and row lengths: tf.ragged.constant walks nested lists in Python.
        lengths = np.fromiter((len(row.words) for row in rows), np.int64, len(rows))
        words = tf.RaggedTensor.from_row_lengths(
            tf.constant([w for row in rows for w in row.words], tf.string), lengths)
        tags = tf.RaggedTensor.from_row_lengths(
            tf.constant(np.fromiter((t for row in rows for t in row.tags), np.int64,
                                    int(lengths.sum()))), lengths)
        held_out = self.windowed and split != "train"
        out = (self.aligner.align_max_context if held_out else self.aligner.align)(words, tags)
        ids, labels = out["input_ids"], out["labels"]
        arrays = (ids.flat_values.numpy(), ids.row_lengths().numpy(),
                  out["token_type_ids"].flat_values.numpy(),
                  out["untruncated_lengths"].numpy(),
                  (labels.flat_values.numpy(), labels.row_lengths().numpy()))
        if not self.windowed:
            return arrays
        text = out["text"].numpy()
        return (*arrays, text, np.arange(len(text)) - np.searchsorted(text, text))


def _chunks(split: str, shards: list[str], total: int, bounds: list[int], row_type=None):
    """(split, output shard k, rows) chunks of the prepared rows in file order, each at most
    _CHUNK_ROWS rows and within one output shard (rows [bounds[k], bounds[k+1]) go to shard
    k), read block by block as `row_type` (tasks/steps/prepared.py)."""
    k, row = 0, 0
    rows_of_chunk: list = []

    def emit():  # the last item: the chunk's first row's index in the split
        chunk = (split, k, rows_of_chunk[:], row - len(rows_of_chunk))
        rows_of_chunk.clear()
        return chunk

    for rows in prepared.read_prepared_rows(shards, _READ_BLOCK, row_type):
        i = 0
        while i < len(rows):
            if row >= total:
                break  # more rows than the manifest says: reported below
            while bounds[k + 1] <= row:  # empty shards (fewer rows than shards)
                k += 1
            take = min(len(rows) - i, _CHUNK_ROWS - len(rows_of_chunk), bounds[k + 1] - row)
            rows_of_chunk.extend(rows[i:i + take])
            i += take
            row += take
            if len(rows_of_chunk) == _CHUNK_ROWS or row == bounds[k + 1]:
                yield emit()
        else:
            continue
        row += len(rows) - i
    if rows_of_chunk:
        yield emit()
    if row != total:
        raise BertflowError(f"{split} split: the data manifest says {total} rows, its shards "
                            f"hold {row}; run the data step again")


def _write_shards(folder: Path, encoder: SegmentEncoder, splits: dict,
                  num_shards: int, codec=None) -> dict:
    """Write every split's shards and return their manifest entries. Shard k of a split
    holds a contiguous, near-equal row range (file order preserved). The prepared rows are
    read block by block and cut into chunks of at most _CHUNK_ROWS rows, which worker threads
    tokenize while this thread serializes them and appends them to the shard files in
    order: memory holds a few chunks, whatever the data's size. `codec`: how rows become
    record arrays (_RowCodec, the default, or _TokenCodec)."""
    codec = codec or _RowCodec(encoder)
    out = {}
    for split in split_names(splits):
        total = splits[split]["num_examples"]
        names = [f"{split}-{k:05d}-of-{num_shards:05d}.tfrecord" for k in range(num_shards)]
        for name in names:
            (folder / name).touch()
        bounds = np.linspace(0, total, num_shards + 1).astype(int).tolist()
        edges = _histogram_edges(encoder.max_seq_length)
        counts = np.zeros(len(edges) - 1, np.int64)
        truncated = records = 0
        for k, lengths, untruncated in _tokenized(
                codec, _chunks(split, splits[split]["shards"], total, bounds, codec.row_type),
                folder, names):
            counts += np.histogram(lengths, bins=edges)[0]
            truncated += int(np.sum(untruncated > encoder.max_seq_length))
            records += len(lengths)
        out[split] = {"shards": names, "num_examples": total, "num_truncated": truncated,
                      "length_histogram": {"edges": edges, "counts": counts.tolist()}}
        if isinstance(codec, window_data.WindowCodec) or getattr(codec, "windowed", False):
            out[split] = window_data.split_counts(out[split], records)
    return out


def _tokenized(codec, chunks, folder: Path, names: list[str]):
    """Tokenize `chunks` on worker threads (up to 2 chunks each ahead; the TensorFlow kernels
    release the GIL); serialize (GIL-bound numpy) and append each to its shard in order on
    this thread. Yields (shard, stored lengths, pre-truncation lengths) per chunk."""
    workers = _cpu_count()
    ahead = 2 * workers

    def tokenize(chunk):
        if isinstance(codec, _TokenCodec):  # held-out windows are labelled otherwise
            return codec.encode(chunk[2], chunk[0])
        return codec.encode(chunk[2])

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
            k = chunk[1]
            ids, lengths, types, untruncated, labels, *windowed = future.result()
            # Windows (window_data.WindowCodec) carry their text's index in the chunk.
            # Token windows also carry their place in their text: [text_id, window].
            text_ids = windowed[0] + chunk[3] if windowed else None
            if len(windowed) > 1:
                text_ids = np.stack([text_ids, windowed[1]], 1)
            if library is not None and getattr(labels, "dtype", None) == np.int64 \
                    and text_ids is None:
                library.write(folder / names[k], ids, lengths, types, labels)
            else:
                records, _ = tfrecord_io.example_records(ids, lengths, types, labels,
                                                         framed=True, text_ids=text_ids)
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
