"""Rows to score from a CSV, TSV or JSON Lines file, streamed, where a bad row is a value
(Parquet files: tasks/io/scoring_parquet.py, the same interface; its `open_score_file` picks).

Unlike the training readers (tasks/io/text_readers.py), which refuse a file at its first bad
row, scoring keeps going: a row that cannot be scored (bytes that are not UTF-8, an empty
text, a malformed JSON line or CSV row) comes out as a `Row` with its `error`, and the
scoring step writes it to the errors file. Every record of the file comes out exactly once,
as a row to score or an error, so rows scored + error rows = the file's records.

A record is a non-blank JSON line, or a CSV/TSV row after the header (a quoted field may span
lines; `line` is where it starts, as an editor counts with the header as line 1). `index`
counts records from 0: a shard is a range of indexes. Bytes are decoded with
surrogateescape, so a bad byte marks only the cells it is in.
"""
from __future__ import annotations

import codecs
import csv
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Iterator, Optional

from tasks.errors import DataError
from tasks.io import storage
from tasks.io.chunked_reader import BLOCK_SIZE, line_blocks
from tasks.io.text_readers import format_of

# Read by scoring only (training's readers take the text formats): a file so named, with
# file_format auto, is read with pyarrow.
PARQUET_EXTENSIONS = (".parquet",)

_UNDECODABLE = re.compile("[\udc80-\udcff]")  # what surrogateescape made of a bad byte


def score_format(uri: str, file_format: str) -> str:
    """format_of, and "parquet" for a .parquet file under file_format auto."""
    if file_format == "auto" and uri.lower().endswith(PARQUET_EXTENSIONS):
        return "parquet"
    return format_of(uri, file_format)


@dataclass(frozen=True)
class Row:
    index: int  # the record's number in its file, from 0
    line: int  # the line it starts on
    text: str = ""
    text_pair: Optional[str] = None
    id: Optional[str] = None
    error: str = ""  # why it cannot be scored; "" for a good row


class ScoreFile:
    """One input file's records. `columns()` reads only the start (the header, or the first
    JSON line's keys); `rows()` streams them all. After `rows()` is exhausted, `sha256` and
    `records` describe the whole file."""

    header_line: Optional[int] = 1  # where a missing column is looked for

    def __init__(self, uri: str, file_format: str, text_column: str,
                 pair_column: Optional[str] = None, id_column: Optional[str] = None,
                 block_size: int = BLOCK_SIZE, every: int = 10_000):
        self.uri, self.fmt = uri, score_format(uri, file_format)
        self.every = every  # records between two entries of `starts`
        self.text_column, self.pair_column, self.id_column = text_column, pair_column, id_column
        self.block_size = block_size
        self.sha256 = ""
        self.records = 0
        self.starts: list[dict] = []

    # --- lines ---------------------------------------------------------------------------
    def _lines(self, offset: int = 0, line: int = 1, digest=None) -> Iterator[tuple]:
        """(line number, byte offset, text with its ending) of each line from byte `offset`
        (a line start) on, numbered from `line`; a leading BOM dropped."""
        if not storage.exists(self.uri):
            raise DataError(self.uri, "file not found", hint="check input_uri")

        def hashed():
            for block in storage.iter_bytes(self.uri, self.block_size, offset):
                if digest is not None:
                    digest.update(block)
                yield block

        position, first = offset, offset == 0
        for block in line_blocks(hashed()):
            skip = 3 if first and block.startswith(codecs.BOM_UTF8) else 0
            first = False
            # Lines cut in the bytes, each decoded alone. bytes.splitlines cuts at \n, \r\n
            # and \r only, as open(newline="") does (str.splitlines would also cut at form
            # feeds and other separators inside a text), and UTF-8 never puts those bytes
            # inside a character. Decoding the block into a StringIO held 8x the block at its
            # peak (64 MB for 8 MB, tracemalloc).
            position += skip
            for raw in (block[skip:] if skip else block).splitlines(keepends=True):
                yield line, position, raw.decode("utf-8", "surrogateescape")
                line += 1
                position += len(raw)

    def columns(self) -> list[str]:
        for _, _, record in self._records(self._lines()):
            if isinstance(record, dict):
                return list(record)
            if isinstance(record, list):
                return record  # the header
        return []

    def _records(self, lines: Iterator[tuple]) -> Iterator[tuple[int, int, object]]:
        """(line, byte offset, record) of each record: a dict per JSON line, the header (at
        the file's start) then a list per CSV/TSV row, or an error text for a record that
        cannot be parsed."""
        if self.fmt == "jsonl":
            for number, offset, raw in lines:
                if not raw.strip():
                    continue
                try:
                    record = json.loads(raw)
                except json.JSONDecodeError as err:
                    record = f"malformed JSON: {err.msg} at column {err.colno}"
                if not isinstance(record, (dict, str)):
                    record = f"expected a JSON object, found {type(record).__name__}"
                yield number, offset, record
            return
        starts: dict[int, int] = {}  # line -> byte offset of the lines csv has read ahead

        def texts():
            for number, offset, text in lines:
                starts[number] = offset
                yield text

        reader = csv.reader(texts(), delimiter="\t" if self.fmt == "tsv" else ",")
        while True:
            try:
                record = next(reader)
            except StopIteration:
                return
            except csv.Error as err:
                record = f"malformed {self.fmt.upper()} row: {err}"
            first = min(starts)  # where this record began
            offset = starts[first]
            starts.clear()
            if isinstance(record, list) and not any(cell.strip() for cell in record):
                continue
            yield first, offset, record

    # --- rows -------------------------------------------------------------------------------
    def header(self) -> Optional[list[str]]:
        """A CSV/TSV file's column names (None for JSON Lines), checked to hold the
        configured columns."""
        if self.fmt == "jsonl":
            return None
        first = next(self._records(self._lines()), None)
        header = [c.strip() for c in first[2]] if first and isinstance(first[2], list) else []
        self._require(header)
        return header

    def rows(self, start: int = 0, end: Optional[int] = None,
             at: Optional[dict] = None) -> Iterator[Row]:
        """The records with index in [start, end) as Rows. `at` ({"index", "line",
        "offset"} of a record, from `starts`) lets the read begin there instead of at the
        file's start. A read from the start to the end sets `sha256` and `records` (the
        file's record count) and `starts`: where every `every`-th record begins."""
        header = self.header()
        index, line, offset = (at["index"], at["line"], at["offset"]) if at else (0, 1, 0)
        digest = hashlib.sha256() if offset == 0 else None
        records = self._records(self._lines(offset, line, digest))
        if header is not None and offset == 0:
            next(records, None)  # the header
        self.starts = []
        for line, offset, record in records:
            if index % self.every == 0:
                self.starts.append({"index": index, "line": line, "offset": offset})
            if end is not None and index >= end and at is not None:
                return  # a shard read from its offset stops after its rows
            if start <= index and (end is None or index < end):
                yield self._row(index, line, record, header)
            index += 1
        if digest is not None:
            self.records, self.sha256 = index, digest.hexdigest()

    def _require(self, columns: list[str]) -> None:
        wanted = [c for c in (self.text_column, self.pair_column, self.id_column) if c]
        missing = [c for c in wanted if c not in columns]
        if missing:
            raise DataError(self.uri, f"no column '{missing[0]}'; columns found: "
                                      f"{', '.join(columns) or '(none)'}",
                            line=self.header_line,
                            hint="set text_column / text_pair_column / id_column to the "
                                 "file's column names")

    def check_columns(self) -> None:
        """DataError naming the file and the columns it has when a configured one is
        missing (JSON Lines: from the first record's keys)."""
        self._require(self.header() or self.columns())

    def _row(self, index: int, line: int, record, header) -> Row:
        if isinstance(record, str):
            return Row(index, line, error=record)
        if isinstance(record, list):
            if len(record) != len(header):
                return Row(index, line, error=f"expected {len(header)} fields like the "
                                              f"header, found {len(record)}")
            record = dict(zip(header, record))
        cells = {}
        for role, column in (("text", self.text_column), ("text_pair", self.pair_column),
                             ("id", self.id_column)):
            if not column:
                continue
            value = record.get(column)
            if value is None and role != "id":
                return Row(index, line, error=f"no field '{column}'")
            value = "" if value is None else str(value)
            if _UNDECODABLE.search(value):
                return Row(index, line, error=f"not valid UTF-8 in column '{column}'")
            cells[role] = value.strip() if role != "id" else value
            if role != "id" and not cells[role]:
                return Row(index, line, error=f"empty {role.replace('_', ' ')} in column "
                                              f"'{column}'")
        return Row(index, line, cells["text"], cells.get("text_pair"), cells.get("id"))
