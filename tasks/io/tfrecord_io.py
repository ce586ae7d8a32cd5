"""tf.train.Example serialization and TFRecord framing for the tokenize step, vectorized in numpy.

Why hand-written and not `tf.io.TFRecordWriter` + `tf.train.Example` / `tf.io.encode_proto`:
the library path needs one Python call per record to write (and builds protos per row or in
TensorFlow ops), which made serialization the larger half of the tokenize step; this module
writes whole chunks of records with a handful of numpy calls. The figure that decides it
(archived, benchmarks/results/archive/scale_writers.json, at load ~15; no live file): with
`tf.io.encode_proto` + `tf.io.TFRecordWriter`
(`LibraryShardWriter` below), data + tokenize at 1M rows took 1.48x as long end to end
(median 121.2 s vs 81.7 s). Keep this module only while that ratio stays above 1.3x. Output is byte-identical to the library's (tests/test_tokenize.py checks both the
Example bytes against protobuf/encode_proto and whole files against TFRecordWriter).
"""
from __future__ import annotations

import google_crc32c
import numpy as np
import tensorflow as tf

# --- tf.train.Example serialization and TFRecord framing, vectorized ----------------------
# Layout of one record (every length a varint; fields in this order, as tf.io.encode_proto
# wrote them): Example{1: Features{1: FeatureEntry{1: key, 2: Feature{3: Int64List{1: packed
# values}}}} x (input_ids, token_type_ids, label[, text_id])}. text_id: a windowed text's index
# in its split, on each of its windows' records (tasks/model/windows.py).
_KEYS = (b"input_ids", b"token_type_ids", b"label", b"text_id")
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
    buf, starts = example_records(ids, lengths, types, np.asarray(labels, np.int64).ravel(),
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


def example_records(ids: np.ndarray, lengths: np.ndarray, types: np.ndarray,
                     labels: np.ndarray, framed: bool,
                     text_ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Records of a batch of rows in one uint8 buffer, record i at [starts[i], starts[i + 1]).

    framed: each record is a TFRecord (8-byte length, its masked CRC32C, the Example, the
    Example's masked CRC32C), so a run of records is a valid TFRecord file as it stands.
    Built as per-record header strings and the packed id/type varints, interleaved.

    labels: int64 [n] (an Int64List of one value per record), float32 [n, k] (a FloatList
    of k values: multi-hot vectors, scores; packed fixed 4-byte little-endian floats, as
    protobuf writes them), or a pair (flat int64 values, row lengths): an Int64List of each
    record's own length (token classification: one tag id per word piece).
    text_ids: int64 [n] (or [n, k]: k values a record), written as a fourth feature
    `text_id` when given.
    """
    n = len(lengths)
    lengths = np.asarray(lengths, np.int64)
    splits = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=splits[1:])
    id_bytes, id_sizes = _packed_varints(np.asarray(ids, np.int64))
    type_bytes, type_sizes = _packed_varints(np.asarray(types, np.int64))
    per_row_lists = isinstance(labels, tuple)
    floats = not per_row_lists and np.asarray(labels).dtype.kind == "f"
    if per_row_lists:
        flat, label_lengths = labels
        label_splits = np.zeros(n + 1, np.int64)
        np.cumsum(np.asarray(label_lengths, np.int64), out=label_splits[1:])
        list_bytes, list_sizes = _packed_varints(np.asarray(flat, np.int64))
        ends = np.zeros(len(list_sizes) + 1, np.int64)
        np.cumsum(list_sizes, out=ends[1:])
        label_sizes = ends[label_splits[1:]] - ends[label_splits[:-1]]
    elif floats:
        label_bytes = np.ascontiguousarray(labels, "<f4").reshape(n, -1).view(np.uint8)
        label_sizes = np.full(n, label_bytes.shape[1], np.int64)
    else:
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
    if text_ids is not None:  # columns: [n] or [n, values per record]
        text_ids = np.asarray(text_ids, np.int64).reshape(n, -1)
        sizes.append(nested(_KEYS[3], sum(_varint_sizes(np.ascontiguousarray(column).view(
            np.uint64)) for column in text_ids.T)))
    features = sum(1 + _varint_sizes(s[3].view(np.uint64)) + s[3] for s in sizes)
    features = np.asarray(features, np.int64)
    example = 1 + _varint_sizes(features.view(np.uint64)) + features

    def header(k: int, list_tag: bytes = b"\x1a") -> list:
        """list_tag: Feature's int64_list (field 3) or float_list (field 2); both lists
        pack their values as field 1."""
        payload, int64_list, feature, entry = sizes[k]
        key = _KEYS[k]
        return [b"\x0a", entry, b"\x0a" + bytes([len(key)]) + key + b"\x12", feature,
                list_tag, int64_list, b"\x0a", payload]

    framing = []
    if framed:
        framing = [example.astype("<u8").view(np.uint8).reshape(n, 8),
                   _length_crcs(example).astype("<u4").view(np.uint8).reshape(n, 4)]
    pieces = [_packed_rows(n, framing + [b"\x0a", features] + header(0)),
              (id_bytes, sizes[0][0]),
              _packed_rows(n, header(1)),
              (type_bytes, sizes[1][0]),
              _packed_rows(n, header(2, b"\x12") + [label_bytes] if floats
                           else header(2) if per_row_lists else header(2) + [labels])]
    if per_row_lists:
        pieces.append((list_bytes, label_sizes))
    if text_ids is not None:
        pieces.append(_packed_rows(n, header(3) + [np.ascontiguousarray(column)
                                                   for column in text_ids.T]))
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


# --- the library path, for comparison (benchmarks/scale.py --tfrecord-writer library) -------
class LibraryShardWriter:
    """The same records through TensorFlow's own writers: the Examples built by
    `tf.io.encode_proto` (vectorized over a chunk), framed by `tf.io.TFRecordWriter` (one
    Python call per record). Byte-identical output; used to measure what the hand-written
    path is worth, not by the step (set BERTFLOW_TFRECORD_WRITER=library to use it)."""

    def __init__(self):
        self._path, self._writer = None, None

    def write(self, path, ids, lengths, types, labels) -> None:
        if path != self._path:
            self.close()
            self._path, self._writer = path, tf.io.TFRecordWriter(str(path))
        for record in library_examples(ids, lengths, types, labels):
            self._writer.write(record)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._path, self._writer = None, None


def library_examples(ids, lengths, types, labels) -> list[bytes]:
    """Serialized Examples of a chunk with tf.io.encode_proto (nested messages built
    inside out: Int64List, Feature, FeatureEntry, Features, Example)."""
    ids = tf.RaggedTensor.from_row_lengths(ids, lengths)
    types = tf.RaggedTensor.from_row_lengths(types, lengths)
    labels = tf.constant(np.asarray(labels, np.int64))
    batch = tf.shape(labels)[0]

    def wrap(message, field, values):
        return tf.io.encode_proto(tf.fill([batch, 1], tf.shape(values)[1]), [values], [field],
                                  message)

    def entry(key, values):
        int64_list = tf.io.encode_proto(
            tf.expand_dims(tf.cast(values.row_lengths(), tf.int32), 1), [values.to_tensor()],
            ["value"], "tensorflow.Int64List")
        feature = wrap("tensorflow.Feature", "int64_list", tf.expand_dims(int64_list, 1))
        return tf.io.encode_proto(tf.fill([batch, 2], 1),
                                  [tf.fill([batch, 1], key), tf.expand_dims(feature, 1)],
                                  ["key", "value"], "tensorflow.Features.FeatureEntry")

    entries = tf.stack([entry("input_ids", ids), entry("token_type_ids", types),
                        entry("label", tf.RaggedTensor.from_tensor(labels[:, None]))], 1)
    features = wrap("tensorflow.Features", "feature", entries)
    return wrap("tensorflow.Example", "features", features[:, None]).numpy().tolist()
