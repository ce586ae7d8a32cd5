"""Rows to score from a Parquet file, the `ScoreFile` way (tasks/io/scoring_reader.py).

Read with pyarrow one row group at a time, in batches of BATCH_ROWS, and only the text, pair
and id columns, so a worker's memory stays flat whatever the file's size. A record is a table
row; its `line` is its row number counted from 1 (the first row is 1), so an output row names
the input row it came from. A null or empty text is a row error, as in the text formats.

Local files are opened in place; gs:// and s3:// files through `RangeFile`: ranged reads of
tasks.io.storage (the footer, then the column chunks of the row groups a shard needs), never
the whole object. The plan's shard starts are record indexes (`{"index": k}`): a shard's read
begins at the row group that holds its first row.
"""
from __future__ import annotations

import hashlib
import io
from typing import Iterator, Optional

from tasks.errors import DataError
from tasks.io import storage
from tasks.io.scoring_reader import Row, ScoreFile, score_format

BATCH_ROWS = 1024  # rows per pyarrow batch inside a row group
HASH_BLOCK = 8 << 20


def open_score_file(uri: str, file_format: str, text_column: str,
                    pair_column: Optional[str] = None, id_column: Optional[str] = None,
                    **kwargs) -> ScoreFile:
    """The reader for an input file of any format: a ParquetScoreFile, else a ScoreFile."""
    reader = ParquetScoreFile if score_format(uri, file_format) == "parquet" else ScoreFile
    return reader(uri, file_format, text_column, pair_column, id_column, **kwargs)


class RangeFile(io.RawIOBase):
    """A read-only, seekable file over a stored object: each read is one ranged read."""

    def __init__(self, uri: str, size: int):
        super().__init__()
        self.uri, self.size, self.pos = uri, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = base + offset
        return self.pos

    def readinto(self, buffer) -> int:
        want = min(len(buffer), self.size - self.pos)
        got = 0
        if want > 0:
            for block in storage.iter_bytes(self.uri, want, self.pos):
                take = min(len(block), want - got)
                buffer[got:got + take] = block[:take]
                got += take
                if got == want:
                    break
        self.pos += got
        return got


class ParquetScoreFile(ScoreFile):
    """One Parquet file's rows; the same interface as ScoreFile (columns, check_columns,
    rows; after a whole read, `records`, `sha256` and `starts`)."""

    header_line = None  # its columns are in the footer's schema

    def _open(self):
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not storage.exists(self.uri):
            raise DataError(self.uri, "file not found", hint="check input_uri")
        if storage.is_local(self.uri):
            source = str(storage.local_path(self.uri))
        else:
            size = storage.list_sizes(self.uri)[self.uri][0]
            source = io.BufferedReader(RangeFile(self.uri, size), buffer_size=1 << 20)
        try:
            return pq.ParquetFile(source)
        except (pa.ArrowInvalid, OSError) as err:
            raise DataError(self.uri, f"not a readable Parquet file: {err}",
                            hint="name Parquet files .parquet, and other files by their "
                                 "format") from None

    def header(self) -> Optional[list[str]]:
        return None

    def columns(self) -> list[str]:
        return list(self._open().schema_arrow.names)

    def rows(self, start: int = 0, end: Optional[int] = None,
             at: Optional[dict] = None) -> Iterator[Row]:
        """The rows with index in [start, end). A read from the start (no `at`) also hashes
        the file and sets `records` and `starts` (every `every`-th row)."""
        parquet = self._open()
        total = parquet.metadata.num_rows
        if at is None:
            self.starts = [{"index": i} for i in range(0, total, self.every)]
            digest = hashlib.sha256()
            for block in storage.iter_bytes(self.uri, HASH_BLOCK):
                digest.update(block)
            self.records, self.sha256 = total, digest.hexdigest()
        end = total if end is None else min(end, total)
        if start >= end:
            return
        self._require(list(parquet.schema_arrow.names))
        groups, first, offset = [], 0, 0  # the row groups that hold [start, end)
        for group in range(parquet.metadata.num_row_groups):
            rows = parquet.metadata.row_group(group).num_rows
            if offset + rows > start and offset < end:
                first = first if groups else offset
                groups.append(group)
            offset += rows
        wanted = [c for c in dict.fromkeys((self.text_column, self.pair_column,
                                            self.id_column)) if c]
        index = first
        for batch in parquet.iter_batches(batch_size=BATCH_ROWS, row_groups=groups,
                                          columns=wanted):
            cells = batch.to_pydict()
            for i in range(batch.num_rows):
                if index >= end:
                    return
                if index >= start:
                    record = {c: "" if cells[c][i] is None else cells[c][i] for c in wanted}
                    yield self._row(index, index + 1, record, None)
                index += 1
