"""Readers of labelled text files: CSV, TSV and JSON Lines, from any URI `tasks.io.storage`
reads, streamed in bounded memory.

TSV is tab-separated; a field may be quoted like CSV, e.g. to hold a line break, as BANKING77's
TSV does. Files are read in blocks (`tasks.io.chunked_reader`, BLOCK_SIZE bytes: local reads,
ranged GETs on gs:// and s3://) and rows are checked as they pass; no list of rows is built.
Every problem is a `DataError` naming the file and the line as an editor shows it (the header
is line 1). What the rows mean (labels, the split) is the data step's (tasks/steps/data.py).
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from typing import Iterator, Optional

from tasks.errors import DataError
from tasks.io import storage
from tasks.io.chunked_reader import BLOCK_SIZE, TextStream

# Token-tagged text (tasks/io/token_readers.py), read by task token_classification only.
CONLL_EXTENSIONS = (".conll", ".bio", ".iob", ".iob2")
FORMATS_BY_EXTENSION = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl",
                        ".json": "jsonl", ".ndjson": "jsonl"}


@dataclass
class Table:
    """A parsed input file, read lazily: its column names, (line, record) pairs (a record
    is a list for CSV/TSV, a dict for JSON Lines) and the key of each wanted column."""

    stream: TextStream
    columns: list[str]
    records: Iterator[tuple[int, object]]
    keys: dict[str, object]


def data_files(uri: str, file_format: str = "auto", also: tuple[str, ...] = ()) -> list[str]:
    """The files `uri` names, sorted: itself, the data files under a prefix ending in `/`
    (recursively; marker files such as `_SUCCESS` or `.keep` skipped; `also`: more data file
    extensions), or a glob's matches.
    Raises DataError naming the prefix or pattern when nothing matches."""
    if uri.endswith("/"):
        files = [u for u in storage.list_uris(uri) if is_data_file(u, file_format, also)]
        if not files:
            raise DataError(uri, "no data files under this prefix", hint=(
                f"data files end in {', '.join(FORMATS_BY_EXTENSION)} unless file_format "
                "is set; names starting with _ or . are skipped"))
    elif "*" in uri or "?" in uri:
        files = storage.glob_uris(uri)
        if not files:
            raise DataError(uri, "the pattern matches no files",
                            hint="* and ? match within one path segment")
    else:
        return [uri]
    return sorted(files)


def is_data_file(uri: str, file_format: str = "auto", also: tuple[str, ...] = ()) -> bool:
    name = uri.rsplit("/", 1)[-1]
    if name.startswith(("_", ".")):  # job markers and hidden files, not data
        return False
    return file_format != "auto" or name.lower().endswith(
        tuple(FORMATS_BY_EXTENSION) + CONLL_EXTENSIONS + also)


def format_of(uri: str, file_format: str = "auto") -> str:
    """"csv", "tsv" or "jsonl": `file_format` unless "auto", else from the extension."""
    if file_format != "auto":
        return file_format
    name = uri.rsplit("/", 1)[-1].lower()
    for ext, fmt in FORMATS_BY_EXTENSION.items():
        if name.endswith(ext):
            return fmt
    if name.endswith(CONLL_EXTENSIONS):
        raise DataError(uri, "a CoNLL file (a token and its tag per line) holds named "
                             "entities, not labelled texts",
                        hint="set task to token_classification")
    raise DataError(uri, "cannot tell the file format from the extension",
                    hint="use .csv, .tsv or .jsonl, or set file_format")


def open_table(uri: str, fmt: str, wanted: list[str], block_size: int = BLOCK_SIZE) -> Table:
    """`uri` opened as a table of format `fmt` ("csv", "tsv" or "jsonl"), its header read and
    checked to hold the `wanted` columns; the records are read lazily, in blocks of
    `block_size` bytes. DataError for a missing file or column, a malformed header."""
    if not storage.exists(uri):
        raise DataError(uri, "file not found", hint="check train_uri / eval_uri")
    stream = TextStream(uri, storage.iter_bytes(uri, block_size))
    if fmt == "jsonl":
        columns, records = _open_jsonl(uri, stream)
        keys = {c: c for c in wanted}
    else:
        columns, records = _open_delimited(uri, stream, fmt)
        keys = {c: columns.index(c) for c in wanted if c in columns}
    missing = [c for c in wanted if c not in columns]
    if missing:
        raise DataError(uri, f"no column '{missing[0]}'; columns found: "
                             f"{', '.join(columns) or '(none)'}",
                        line=1, hint=_column_hint(missing[0], columns))
    return Table(stream, columns, records, keys)


def rows(uri: str, table: Table, text_column: str, label_column: str,
         pair_column: Optional[str] = None,
         labels: Optional[list[str]] = None) -> Iterator[tuple]:
    """(line, text, text_pair, label) of each row of `table`, every cell checked as it passes
    (label: a string, or a list of strings where a JSON Lines cell holds a list):
    DataError for an empty text or label, a missing field, a label not in `labels` (when
    given), a file without data rows."""
    allowed = set(labels) if labels is not None else None
    text_key = table.keys[text_column]
    label_key = table.keys[label_column]
    pair_key = table.keys[pair_column] if pair_column else None
    any_rows = False
    for line, record in table.records:
        try:  # fast path; any problem is re-checked below for its exact error
            text = _clean(record[text_key])
            pair = None if pair_key is None else _clean(record[pair_key])
            label = _clean_label(record[label_key])
        except KeyError:
            text = pair = label = ""
        if not text or not label or (pair_key is not None and not pair):
            if isinstance(record, list) and not any(cell.strip() for cell in record):
                continue  # a blank line (e.g. only tabs)
            mapping = record if isinstance(record, dict) else dict(zip(table.columns, record))
            text = _required_cell(uri, line, mapping, text_column, "text")
            pair = (_required_cell(uri, line, mapping, pair_column, "text")
                    if pair_column else None)
            label = (_clean_label(mapping[label_column])
                     if isinstance(mapping.get(label_column), list) else
                     _required_cell(uri, line, mapping, label_column, "label"))
        if allowed is not None and (label not in allowed if isinstance(label, str) else
                                    not allowed.issuperset(label)):
            raise DataError(uri, f"label '{label}' is not one of the allowed labels "
                                 f"{labels}", line=line,
                            hint="fix the row, or add the label to the 'labels' setting")
        any_rows = True
        yield line, text, pair, label
    if not any_rows:
        raise_no_rows(uri)


def _clean_label(value):
    """A label cell: a string, or for JSON Lines a list of names kept as a list (a
    multi-label row), its names cleaned; what the list means is the data step's."""
    if type(value) is list:
        return [_clean(name) for name in value]
    return _clean(value)


def _clean(value) -> str:
    # Strip: SST-2 and other sources end texts with a space before the tab.
    if type(value) is str:
        return value.strip()
    return "" if value is None else str(value).strip()


def _open_delimited(uri: str, stream: TextStream, fmt: str) -> tuple[list[str], Iterator]:
    if fmt == "tsv":
        reader = csv.reader(stream.lines(), delimiter="\t")
    else:
        reader = csv.reader(stream.lines())
    try:
        header = [name.strip() for name in next(reader)]
    except csv.Error as err:
        raise DataError(uri, f"unreadable header: {err}", line=1) from None
    except StopIteration:
        header = []
    return header, _delimited_records(uri, reader, header, fmt)


def _delimited_records(uri: str, reader, header: list[str],
                       fmt: str) -> Iterator[tuple[int, list]]:
    previous_end = reader.line_num
    width = len(header)
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            raise DataError(uri, f"malformed {fmt.upper()} row: {err}",
                            line=previous_end + 1) from None
        line, previous_end = previous_end + 1, reader.line_num  # a quoted row may span lines
        if len(row) != width:
            if not any(cell.strip() for cell in row):
                continue  # blank line
            sep = "tab-separated" if fmt == "tsv" else "comma-separated"
            raise DataError(uri, f"expected {width} {sep} fields like the header, "
                                 f"found {len(row)}", line=line,
                            hint="a text may contain a stray tab" if fmt == "tsv"
                            else "quote texts that contain commas")
        yield line, row


def _open_jsonl(uri: str, stream: TextStream) -> tuple[list[str], Iterator]:
    records = _jsonl_records(uri, stream)
    first = next(records, None)
    if first is None:
        raise_no_rows(uri)

    def chained() -> Iterator[tuple[int, dict]]:
        yield first
        yield from records

    return list(first[1]), chained()


def _jsonl_records(uri: str, stream: TextStream) -> Iterator[tuple[int, dict]]:
    line = 0
    for block in stream.text_blocks():
        pieces = block.split("\n")
        if block.endswith("\n"):
            pieces.pop()  # the empty piece after the block's last newline is no line
        for raw in pieces:
            line += 1
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except json.JSONDecodeError as err:
                raise DataError(uri, f"malformed JSON: {err.msg} at column {err.colno}",
                                line=line, hint="each line must be one JSON object") from None
            if not isinstance(record, dict):
                raise DataError(uri, f"expected a JSON object, found "
                                     f"{type(record).__name__}", line=line)
            yield line, record


def _required_cell(uri: str, line: int, record: dict, column: str, what: str) -> str:
    if column not in record:  # JSON Lines records may differ from the first one
        raise DataError(uri, f"no field '{column}'; fields found: {', '.join(record)}",
                        line=line)
    value = _clean(record[column])
    if not value:
        raise DataError(uri, f"empty {what} in column '{column}'", line=line,
                        hint="remove the row or fill it in")
    return value


def _column_hint(missing: str, found: list[str]) -> str:
    close = [c for c in found if c.lower() == missing.lower()]
    if close:
        return f"column names are case-sensitive: did you mean '{close[0]}'?"
    return "set text_column / text_pair_column / label_column to the file's column names"


def raise_no_rows(uri: str) -> None:
    raise DataError(uri, "no data rows (only a header)", line=1)
