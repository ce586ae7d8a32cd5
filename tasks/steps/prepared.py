"""The data step's output: prepared rows in JSON Lines shards, written and read back.

A shard holds SHARD_ROWS rows, written to a local temporary file and moved or uploaded into
place when full; the tokenize step reads the shards back block by block.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterator, Optional, Union

import msgspec

from tasks.io import storage
from tasks.io.chunked_reader import line_blocks
from tasks.io.uris import join_uri

SHARD_ROWS = 1_000_000  # prepared rows per shard file (~50-100 MB of JSON Lines)
_WRITE_BATCH = 4096  # rows encoded per msgspec call


class PreparedRow(msgspec.Struct):
    """One line of a prepared shard."""

    text: str
    text_pair: Optional[str]
    # classification: the label's index; multi_label: the indices of its labels;
    # regression: the score.
    label: Union[int, float, list[int]]


class TokenRow(msgspec.Struct):
    """One sentence of a token classification shard: its words and each word's tag index."""

    words: list[str]
    tags: list[int]


_ENCODER = msgspec.json.Encoder()


class SplitWriter:
    """Appends prepared rows to `{step}/{name}-{i:05d}.jsonl` shards of SHARD_ROWS rows,
    each written to a local temporary file and moved or uploaded into place when full."""

    def __init__(self, step: str, name: str, labels: list[str]):
        self.step, self.name, self.labels = step, name, labels
        self.shards: list[str] = []
        self.rows = self.bytes = 0
        self.counts = [0] * len(labels)
        self._batch: list[PreparedRow] = []
        self._in_shard = 0
        self._file = None
        self._path: Optional[Path] = None
        local = storage.is_local(step)
        self._tmp_dir = str(storage.local_path(step)) if local else None

    def add(self, row: msgspec.Struct, names: list[int]) -> None:
        """`row`: a PreparedRow or TokenRow; `names`: the indices of the label names the row
        carries (counted in label_counts)."""
        self._batch.append(row)
        for name in names:
            self.counts[name] += 1
        if len(self._batch) >= _WRITE_BATCH or self._in_shard + len(self._batch) >= SHARD_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self._batch:
            return
        if self._file is None:
            if self._tmp_dir:
                os.makedirs(self._tmp_dir, exist_ok=True)
            fd, path = tempfile.mkstemp(prefix=f".{self.name}-", suffix=".tmp",
                                        dir=self._tmp_dir)
            self._file, self._path = os.fdopen(fd, "wb"), Path(path)
        data = _ENCODER.encode_lines(self._batch)
        self._file.write(data)
        self.bytes += len(data)
        self.rows += len(self._batch)
        self._in_shard += len(self._batch)
        self._batch.clear()
        if self._in_shard >= SHARD_ROWS:
            self._close_shard()

    def _close_shard(self) -> None:
        if self._file is None:
            return
        self._file.close()
        uri = join_uri(self.step, f"{self.name}-{len(self.shards):05d}.jsonl")
        storage.upload_file(self._path, uri)
        self.shards.append(uri)
        self._file, self._path, self._in_shard = None, None, 0

    def close(self) -> dict:
        self._flush()
        self._close_shard()
        return {"shards": self.shards, "num_examples": self.rows, "num_bytes": self.bytes,
                "label_counts": dict(zip(self.labels, self.counts))}


def read_prepared_rows(shards: list[str], block_size: int = 4 << 20,
                       row_type: type = None) -> Iterator[list]:
    """The prepared rows of a split's shards, as lists of `row_type` (PreparedRow by
    default; TokenRow for token classification), one block at a time."""
    decoder = msgspec.json.Decoder(row_type or PreparedRow)
    for uri in shards:
        for block in line_blocks(storage.iter_bytes(uri, block_size)):
            yield decoder.decode_lines(block)
