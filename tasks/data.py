"""Data step: read, validate and split the labelled text, write the prepared JSON Lines.

Inputs are CSV, TSV (tab-separated; a field may be quoted like CSV, e.g. to hold a line
break, as BANKING77's TSV does) or JSON Lines, from any URI `tasks.storage` reads. `train_uri` / `eval_uri` name one file, a prefix ending in `/`
(every data file under it) or a glob (`*`, `?` within one path segment); several files are
read in sorted order and concatenated. Every problem is raised as a `DataError` naming the
file and the line as an editor shows it (the header is line 1) before any expensive work
starts.

Outputs, under the run's `data/` folder: `train.jsonl` and `eval.jsonl`, one
`{"text", "text_pair", "label": int}` per line (label indexes the manifest's `labels`), and
`manifest.json` as described in CONTRACTS.md.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import random
from collections import Counter
from dataclasses import dataclass
from typing import Iterator, Optional

from tasks import runlayout, storage
from tasks.config import RunConfig, join_uri
from tasks.errors import DataError
from tasks.runlayout import RunContext

_FORMATS_BY_EXTENSION = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl",
                         ".json": "jsonl", ".ndjson": "jsonl"}


@dataclass(frozen=True)
class Example:
    uri: str  # its file: checks across rows (labels) must name the file of the row
    line: int
    text: str
    text_pair: Optional[str]
    label: str


@dataclass(frozen=True)
class Source:
    """The validated rows of one input setting (a file, prefix or glob)."""

    uri: str  # as configured
    files: list[tuple[str, str]]  # (uri, sha256) of every file read, in reading order
    examples: list[Example]

    @property
    def sha256(self) -> str:
        """Content identity: the file's sha256, or for several files the sha256 of their
        sha256s in order (independent of where the files are stored)."""
        if len(self.files) == 1:
            return self.files[0][1]
        return hashlib.sha256("\n".join(sha for _, sha in self.files).encode()).hexdigest()


@dataclass(frozen=True)
class _Table:
    """A parsed input file: its column names and (line, record) pairs, read lazily."""

    sha256: str
    columns: list[str]
    records: Iterator[tuple[int, dict]]


# --- public API --------------------------------------------------------------------------
def check_inputs(cfg: RunConfig) -> None:
    """Cheap pre-flight for the validate step: each input exists, is not empty, is decodable
    up to its first record, and has the configured columns. Raises DataError."""
    for pattern in _input_uris(cfg):
        for uri in input_files(cfg, pattern):
            table = _open_table(uri, _file_format(cfg, uri), _wanted_columns(cfg))
            if next(table.records, None) is None:
                _raise_no_rows(uri)


def input_files(cfg: RunConfig, uri: str) -> list[str]:
    """The files `uri` names, sorted: itself, the data files under a prefix ending in `/`
    (recursively; marker files such as `_SUCCESS` or `.keep` skipped), or a glob's matches.
    Raises DataError naming the prefix or pattern when nothing matches."""
    if uri.endswith("/"):
        files = [u for u in storage.list_uris(uri) if _is_data_file(cfg, u)]
        if not files:
            raise DataError(uri, "no data files under this prefix", hint=(
                f"data files end in {', '.join(_FORMATS_BY_EXTENSION)} unless file_format "
                "is set; names starting with _ or . are skipped"))
    elif "*" in uri or "?" in uri:
        files = storage.glob_uris(uri)
        if not files:
            raise DataError(uri, "the pattern matches no files",
                            hint="* and ? match within one path segment")
    else:
        return [uri]
    return sorted(files)


def load_source(cfg: RunConfig, uri: str) -> Source:
    """Read and validate every row of the file(s) `uri` names (labels still as strings)."""
    files, examples = [], []
    for file_uri in input_files(cfg, uri):
        sha256, rows = _load_file(cfg, file_uri)
        files.append((file_uri, sha256))
        examples += rows
    return Source(uri, files, examples)


def _load_file(cfg: RunConfig, uri: str) -> tuple[str, list[Example]]:
    table = _open_table(uri, _file_format(cfg, uri), _wanted_columns(cfg))
    allowed = set(cfg.labels) if cfg.labels is not None else None
    examples = []
    for line, record in table.records:
        text = _required_cell(uri, line, record, cfg.text_column, "text")
        pair = (_required_cell(uri, line, record, cfg.text_pair_column, "text")
                if cfg.text_pair_column else None)
        label = _required_cell(uri, line, record, cfg.label_column, "label")
        if allowed is not None and label not in allowed:
            raise DataError(uri, f"label '{label}' is not one of the allowed labels "
                                 f"{cfg.labels}", line=line,
                            hint="fix the row, or add the label to the 'labels' setting")
        examples.append(Example(uri, line, text, pair, label))
    if not examples:
        _raise_no_rows(uri)
    return table.sha256, examples


def label_vocabulary(cfg: RunConfig, train: list[Example], train_uri: str) -> list[str]:
    """cfg.labels in its order if given, else the sorted distinct training labels."""
    counts = Counter(ex.label for ex in train)
    if len(counts) < 2:
        raise DataError(train_uri, f"only one class ({next(iter(counts))!r}) in column "
                                   f"'{cfg.label_column}'; a classifier needs at least 2",
                        hint="check label_column, or add examples of the other classes")
    _reject_free_text_labels(cfg, train, counts)
    return list(cfg.labels) if cfg.labels is not None else sorted(counts)


def stratified_split(examples: list[Example], eval_fraction: float,
                     seed: int) -> tuple[list[Example], list[Example]]:
    """Seeded, per-class hold-out of about `eval_fraction` of each class.

    A class with n >= 2 rows gives round(n * eval_fraction) rows to eval, at least 1 and at
    most n - 1, so every class keeps a training row and appears in eval when it can. A class
    with a single row stays in train only (and is then absent from eval). Both splits keep the
    input order. The result depends only on the rows and the seed.
    """
    by_label: dict[str, list[int]] = {}
    for i, ex in enumerate(examples):
        by_label.setdefault(ex.label, []).append(i)
    rng = random.Random(seed)
    held_out: set[int] = set()
    for label in sorted(by_label):
        indices = by_label[label]
        n = len(indices)
        if n < 2:
            continue
        k = min(n - 1, max(1, int(n * eval_fraction + 0.5)))
        held_out.update(rng.sample(indices, k))
    train = [ex for i, ex in enumerate(examples) if i not in held_out]
    evals = [ex for i, ex in enumerate(examples) if i in held_out]
    return train, evals


def run(cfg: RunConfig, ctx: RunContext) -> str:
    """Validate and split the inputs, write the prepared splits; return the manifest URI."""
    train_source = load_source(cfg, cfg.train_uri)
    train = train_source.examples
    labels = label_vocabulary(cfg, train, cfg.train_uri)
    eval_source = load_source(cfg, cfg.eval_uri) if cfg.eval_uri else None
    if eval_source:
        evals = eval_source.examples
        _reject_unseen_labels(evals, {ex.label for ex in train})
    else:
        train, evals = stratified_split(train, cfg.eval_fraction, cfg.seed)
        if not evals:
            raise DataError(cfg.train_uri, "too few rows to hold out an evaluation split",
                            hint="add rows, or give an eval_uri")
    step = ctx.step_uri("data")
    index = {label: i for i, label in enumerate(labels)}
    splits = {name: _write_split(join_uri(step, f"{name}.jsonl"), rows, labels, index)
              for name, rows in (("train", train), ("eval", evals))}
    manifest = {
        "labels": labels,
        "has_pair": cfg.text_pair_column is not None,
        "eval_source": "file" if eval_source else "split",
        "splits": splits,
        "sources": {"train": _describe(train_source),
                    "eval": _describe(eval_source) if eval_source else None},
    }
    return runlayout.write_manifest(step, manifest)


# --- reading -----------------------------------------------------------------------------
def _input_uris(cfg: RunConfig) -> list[str]:
    return [cfg.train_uri] + ([cfg.eval_uri] if cfg.eval_uri else [])


def _is_data_file(cfg: RunConfig, uri: str) -> bool:
    name = uri.rsplit("/", 1)[-1]
    if name.startswith(("_", ".")):  # job markers and hidden files, not data
        return False
    return cfg.file_format != "auto" or name.lower().endswith(tuple(_FORMATS_BY_EXTENSION))


def _wanted_columns(cfg: RunConfig) -> list[str]:
    return [c for c in (cfg.text_column, cfg.text_pair_column, cfg.label_column) if c]


def _file_format(cfg: RunConfig, uri: str) -> str:
    if cfg.file_format != "auto":
        return cfg.file_format
    name = uri.rsplit("/", 1)[-1].lower()
    for ext, fmt in _FORMATS_BY_EXTENSION.items():
        if name.endswith(ext):
            return fmt
    raise DataError(uri, "cannot tell the file format from the extension",
                    hint="use .csv, .tsv or .jsonl, or set file_format")


def _read_text(uri: str) -> tuple[str, str]:
    """The decoded file and the sha256 of its bytes."""
    if not storage.exists(uri):
        raise DataError(uri, "file not found", hint="check train_uri / eval_uri")
    data = storage.read_bytes(uri)
    if not data.strip():
        raise DataError(uri, "file is empty")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line_start = data.rfind(b"\n", 0, err.start) + 1
        raise DataError(uri, f"not valid UTF-8: byte 0x{data[err.start]:02x} at byte offset "
                             f"{err.start} (column {err.start - line_start + 1} of the line)",
                        line=data.count(b"\n", 0, err.start) + 1,
                        hint="re-save the file as UTF-8") from None
    return text, hashlib.sha256(data).hexdigest()


def _open_table(uri: str, fmt: str, wanted: list[str]) -> _Table:
    text, sha256 = _read_text(uri)
    columns, records = (_open_jsonl(uri, text) if fmt == "jsonl"
                        else _open_delimited(uri, text, fmt))
    missing = [c for c in wanted if c not in columns]
    if missing:
        raise DataError(uri, f"no column '{missing[0]}'; columns found: "
                             f"{', '.join(columns) or '(none)'}",
                        line=1, hint=_column_hint(missing[0], columns))
    return _Table(sha256, columns, records)


def _open_delimited(uri: str, text: str, fmt: str) -> tuple[list[str], Iterator]:
    if fmt == "tsv":
        reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t")
    else:
        reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [name.strip() for name in next(reader)]
    except csv.Error as err:
        raise DataError(uri, f"unreadable header: {err}", line=1) from None
    return header, _delimited_records(uri, reader, header, fmt)


def _delimited_records(uri: str, reader, header: list[str],
                       fmt: str) -> Iterator[tuple[int, dict]]:
    previous_end = reader.line_num
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            raise DataError(uri, f"malformed {fmt.upper()} row: {err}",
                            line=previous_end + 1) from None
        line, previous_end = previous_end + 1, reader.line_num  # a quoted row may span lines
        if not any(cell.strip() for cell in row):
            continue  # blank line
        if len(row) != len(header):
            sep = "tab-separated" if fmt == "tsv" else "comma-separated"
            raise DataError(uri, f"expected {len(header)} {sep} fields like the header, "
                                 f"found {len(row)}", line=line,
                            hint="a text may contain a stray tab" if fmt == "tsv"
                            else "quote texts that contain commas")
        yield line, dict(zip(header, row))


def _open_jsonl(uri: str, text: str) -> tuple[list[str], Iterator]:
    records = _jsonl_records(uri, text)
    first = next(records, None)
    if first is None:
        _raise_no_rows(uri)

    def chained() -> Iterator[tuple[int, dict]]:
        yield first
        yield from records

    return list(first[1]), chained()


def _jsonl_records(uri: str, text: str) -> Iterator[tuple[int, dict]]:
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as err:
            raise DataError(uri, f"malformed JSON: {err.msg} at column {err.colno}",
                            line=line, hint="each line must be one JSON object") from None
        if not isinstance(record, dict):
            raise DataError(uri, f"expected a JSON object, found {type(record).__name__}",
                            line=line)
        yield line, record


def _required_cell(uri: str, line: int, record: dict, column: str, what: str) -> str:
    if column not in record:  # JSON Lines records may differ from the first one
        raise DataError(uri, f"no field '{column}'; fields found: {', '.join(record)}",
                        line=line)
    value = record[column]
    # Strip: SST-2 and other sources end texts with a space before the tab.
    value = "" if value is None else str(value).strip()
    if not value:
        raise DataError(uri, f"empty {what} in column '{column}'", line=line,
                        hint="remove the row or fill it in")
    return value


def _column_hint(missing: str, found: list[str]) -> str:
    close = [c for c in found if c.lower() == missing.lower()]
    if close:
        return f"column names are case-sensitive: did you mean '{close[0]}'?"
    return "set text_column / text_pair_column / label_column to the file's column names"


def _raise_no_rows(uri: str) -> None:
    raise DataError(uri, "no data rows (only a header)", line=1)


# --- validation across rows ----------------------------------------------------------------
def _reject_free_text_labels(cfg: RunConfig, rows: list[Example], counts: Counter) -> None:
    """Labels that are mostly distinct multi-word strings are texts: columns swapped?

    Real label sets repeat (even 77 intents over 9k rows) and are rarely sentences, so both
    signs together mean the label column holds the texts.
    """
    distinct = len(counts)
    with_spaces = sum(1 for label in counts if " " in label)
    if distinct >= 5 and distinct > 0.5 * len(rows) and with_spaces > 0.5 * distinct:
        example = next(ex for ex in rows if " " in ex.label)
        raise DataError(
            example.uri, f"label column '{cfg.label_column}' looks like free text: {distinct} "
                 f"distinct values in {len(rows)} rows, most with spaces (e.g. "
                 f"{example.label[:60]!r})", line=example.line,
            hint=f"are label_column ('{cfg.label_column}') and text_column "
                 f"('{cfg.text_column}') swapped?")


def _reject_unseen_labels(rows: list[Example], seen: set[str]) -> None:
    for ex in rows:
        if ex.label not in seen:
            raise DataError(ex.uri, f"label '{ex.label}' never appears in the training data",
                            line=ex.line, hint="the model cannot learn it; add training "
                                               "examples or drop these rows")


# --- writing -------------------------------------------------------------------------------
def _write_split(uri: str, rows: list[Example], labels: list[str],
                 index: dict[str, int]) -> dict:
    lines = [json.dumps({"text": ex.text, "text_pair": ex.text_pair,
                         "label": index[ex.label]}, ensure_ascii=False) for ex in rows]
    storage.write_text(uri, "\n".join(lines) + "\n")
    counts = Counter(ex.label for ex in rows)
    return {"uri": uri, "num_examples": len(rows),
            "label_counts": {label: counts.get(label, 0) for label in labels}}


def _describe(source: Source) -> dict:
    return {"uri": source.uri, "sha256": source.sha256,
            "files": [{"uri": uri, "sha256": sha256} for uri, sha256 in source.files]}
