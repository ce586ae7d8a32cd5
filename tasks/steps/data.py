"""Data step: read, validate and split the labelled text, write the prepared rows as shards.

Three roles (docs/experiments.md): train, validation (steers a run: in-train evaluation,
the best checkpoint, early stopping, a sweep's winner) and test (the `eval` split, read once
per version by the evaluation the gate uses). Inputs are CSV, TSV or JSON Lines, read by
`tasks.io.text_readers` from any URI `tasks.io.storage` reads. `train_uri`, `validation_uri`
and `test_uri` (`eval_uri`, its former name) name one file, a prefix ending in `/`
(every data file under it) or a glob (`*`, `?` within one path segment); several files are
read in sorted order and concatenated. Every problem is raised as a `DataError` naming the
file and the line as an editor shows it (the header is line 1) before any output is written.

Bounded memory. Files are streamed in blocks (BLOCK_SIZE bytes) and rows are validated as they
pass; no list of rows is ever built. Two passes over the inputs:
1. validate every row, count the rows of each label (the label vocabulary, the checks across
   rows, the split's per-class quotas), hash each file;
2. read again, assign each row to its split and append it to the split's current shard
   (prepared.SHARD_ROWS rows each, written to a local temporary file and moved/uploaded when full).
The state kept is one counter per distinct label (at most MAX_LABELS), so memory depends on
the block size, not on the number of rows, but for the leakage check's 8-byte key per row
(tasks/steps/leakage.py: test rows that are also training rows).

Split (no test file): within each class of n >= 2 rows exactly k = min(n - 1, max(1,
round(n * eval_fraction))) rows are held out, so each class lands within half a row of its
exact fraction (and keeps a training row). Which rows: selection sampling (Knuth's Algorithm S)
driven by a keyed hash of the row: row i of its class goes to eval when
hash(seed, label, text, pair) / 2**64 < (k - taken) / (n - i). The draw depends only on the
row's content and the seed, the quota only on counts, so the split is deterministic, needs no
list of rows, and identical rows draw the same number. Validation rows, when the run uses
them and gives no file, are drawn by the same rule from the rows left (split_rule.Router).

Outputs, under the run's `data/` folder: `{split}-{i:05d}.jsonl` shards
(tasks/steps/prepared.py), one `{"text", "text_pair", "label"}` per line (label indexes the
manifest's `labels`), and `manifest.json` as described in CONTRACTS.md. Token classification
reads sentences instead: tasks/steps/token_data.py.
"""
from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator, Optional

from tasks import class_weights
from tasks.runs import runlayout
from tasks.io import storage, text_readers
from tasks.io.chunked_reader import BLOCK_SIZE
from tasks.config import RunConfig
from tasks.io.uris import combined_sha256
from tasks.errors import DataError
from tasks.runs.runlayout import RunContext
from tasks.steps import data_roles, leakage, token_data
from tasks.training import checkpoint
from tasks.steps.prepared import PreparedRow, SplitWriter
from tasks.steps.split_rule import Router, Splitter
from tasks.task_kinds import LabelError, TaskKind, kind as task_kind

MAX_LABELS = 100_000  # distinct labels: bounds the per-label counters
PREFLIGHT_BLOCK = 64 << 10  # check_inputs reads about this much of each file
PREFLIGHT_ROWS = 100  # and checks this many of its first rows


@dataclass(frozen=True)
class Example:
    uri: str  # its file: checks across rows (labels) must name the file of the row
    line: int
    text: str
    text_pair: Optional[str]
    label: object  # as the task reads it (tasks/task_kinds.py): a name, names or a score


@dataclass(frozen=True)
class Source:
    """The validated rows of one input setting (a file, prefix or glob); small data only
    (tests, tools): the step itself streams."""

    uri: str  # as configured
    files: list[tuple[str, str]]  # (uri, sha256) of every file read, in reading order
    examples: list[Example]

    @property
    def sha256(self) -> str:
        return combined_sha256(self.files)


@dataclass
class _Scan:
    """What pass 1 learns about one input setting."""

    uri: str
    files: list[tuple[str, str]] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)  # rows carrying each label name
    strata: Counter = field(default_factory=Counter)  # rows of each split stratum
    rows: int = 0
    first_line: dict = field(default_factory=dict)  # label name -> (uri, line) first seen


# --- public API --------------------------------------------------------------------------
def check_inputs(cfg: RunConfig) -> None:
    """Cheap pre-flight for the validate step: each input exists, is not empty, has the
    configured columns, and its first PREFLIGHT_ROWS rows are complete with labels the task
    can read (reads about the first block of each file). Raises DataError."""
    if task_kind(cfg.task).per_token:
        token_data.check_inputs(cfg, PREFLIGHT_BLOCK, PREFLIGHT_ROWS)
        return
    for pattern in _input_uris(cfg):
        for uri in input_files(cfg, pattern):
            table = text_readers.open_table(uri, _file_format(cfg, uri),
                                            _wanted_columns(cfg), PREFLIGHT_BLOCK)
            # The first rows' labels as the task reads them: a file written for another
            # task (words where regression needs numbers) fails the validate task.
            rows = _parsed(uri, text_readers.rows(uri, table, cfg.text_column,
                                                  cfg.label_column, cfg.text_pair_column),
                           task_kind(cfg.task), cfg.label_delimiter)
            if not list(itertools.islice(rows, PREFLIGHT_ROWS)):
                text_readers.raise_no_rows(uri)


def input_files(cfg: RunConfig, uri: str) -> list[str]:
    """The files `uri` names, sorted (`tasks.io.text_readers.data_files`)."""
    return text_readers.data_files(uri, cfg.file_format)


def iter_rows(cfg: RunConfig, uri: str,
              block_size: Optional[int] = None) -> tuple[text_readers.Table, Iterator[tuple]]:
    """The validated rows `(line, text, text_pair, label)` of one file, streamed in blocks of
    `block_size` (default BLOCK_SIZE) bytes; the table's `stream.sha256` is known once the
    iterator is exhausted."""
    table = text_readers.open_table(uri, _file_format(cfg, uri), _wanted_columns(cfg),
                                    block_size or BLOCK_SIZE)
    kind = task_kind(cfg.task)
    rows = text_readers.rows(uri, table, cfg.text_column, cfg.label_column,
                             cfg.text_pair_column, cfg.labels if kind.one_name_per_row else None)
    return table, _parsed(uri, rows, kind, cfg.label_delimiter)


def _parsed(uri: str, rows: Iterator[tuple], kind: TaskKind, delimiter: str) -> Iterator[tuple]:
    """The rows with each label cell read as the task reads it (a name, names or a score);
    a cell it cannot read is a DataError naming the line."""
    for line, text, pair, raw in rows:
        try:
            yield line, text, pair, kind.parse(raw, delimiter)
        except LabelError as err:
            raise DataError(uri, err.reason, line=line, hint=err.hint) from None


def load_source(cfg: RunConfig, uri: str) -> Source:
    """Every validated row of the file(s) `uri` names, as a list (small data only)."""
    files, examples = [], []
    for file_uri in input_files(cfg, uri):
        table, rows = iter_rows(cfg, file_uri)
        examples += [Example(file_uri, *row) for row in rows]
        files.append((file_uri, table.stream.sha256))
    return Source(uri, files, examples)


def label_vocabulary(cfg: RunConfig, train: list[Example], train_uri: str) -> list[str]:
    """cfg.labels in its order if given, else the sorted distinct training labels."""
    scan = _Scan(train_uri, rows=len(train))
    names = task_kind(cfg.task).names
    for ex in train:
        for name in names(ex.label):
            scan.counts[name] += 1
            scan.first_line.setdefault(name, (ex.uri, ex.line))
    return _vocabulary(cfg, scan)


def stratified_split(examples: list[Example], eval_fraction: float,
                     seed: int) -> tuple[list[Example], list[Example]]:
    """The step's split rule over a list (small data, tests): see `Splitter`. Both splits
    keep the input order; the result depends only on the rows and the seed."""
    splitter = Splitter(Counter(ex.label for ex in examples), eval_fraction, seed)  # by class
    train, evals = [], []
    for ex in examples:
        (evals if splitter.to_eval(ex.text, ex.text_pair, ex.label) else train).append(ex)
    return train, evals


def run(cfg: RunConfig, ctx: RunContext) -> str:
    """Validate and split the inputs, write the prepared shards; return the manifest URI."""
    if task_kind(cfg.task).per_token:
        return token_data.run(cfg, ctx)
    train_scan = _scan(cfg, cfg.train_uri)
    labels = _vocabulary(cfg, train_scan)
    class_weights.check_labels(cfg.class_weights, labels, cfg.train_uri)
    # Test and validation files: every label must be one training has.
    given = {split: _scan(cfg, uri, seen=train_scan.counts)
             for split, uri in data_roles.role_files(cfg).items()}
    router = Router(train_scan.strata, None if "eval" in given else cfg.eval_fraction,
                    0.0 if "validation" in given else cfg.validation_share, cfg.seed)
    data_roles.check_quotas(cfg, router, "rows")

    step = ctx.step_uri("data")
    storage.delete_prefix(step)  # a retry rewrites the folder: no shard of an earlier try
    index = {label: i for i, label in enumerate(labels)}
    counted = labels if task_kind(cfg.task).names_labels else []  # no counts of scores
    writers = {name: SplitWriter(step, name, counted)
               for name in data_roles.split_names(cfg)}
    check = leakage.LeakageCheck(checkpoint.run_casing(cfg))
    _write_rows(cfg, train_scan, index, writers, router, check=check)
    for split, scan in given.items():
        _write_rows(cfg, scan, index, writers, split=split, check=check)
    splits = {name: writer.close() for name, writer in writers.items()}
    leaked = leakage.report(check, splits["eval"]["shards"], PreparedRow, cfg.fail_on_leakage,
                            cfg.test_data_uri or cfg.train_uri)
    manifest = {
        "task": cfg.task,
        "labels": labels,
        "has_pair": cfg.text_pair_column is not None,
        **data_roles.role_sources(cfg, "validation" in writers),
        "splits": splits,
        "leakage": leaked,
        "sources": {"train": _describe(train_scan),
                    **data_roles.held_out_sources(writers, given, _describe)},
    }
    rule = data_roles.split_rule(cfg, router, task_kind(cfg.task).split_rule)
    if rule:
        manifest["split_rule"] = rule
    return runlayout.write_manifest(step, manifest)


# --- the two passes ------------------------------------------------------------------------
def _scan(cfg: RunConfig, uri: str, seen: Optional[Counter] = None) -> _Scan:
    """Pass 1: validate every row of `uri`'s files, count labels, hash the files. `seen`:
    the training labels, which every evaluation row's label must be one of."""
    scan = _Scan(uri)
    kind = task_kind(cfg.task)
    for file_uri in input_files(cfg, uri):
        table, rows = iter_rows(cfg, file_uri)
        for line, _, _, value in rows:
            scan.rows += 1
            scan.strata[kind.stratum(value)] += 1
            for label in kind.names(value):
                _count_name(cfg, scan, seen, file_uri, line, label)
        scan.files.append((file_uri, table.stream.sha256))
    return scan


def _count_name(cfg: RunConfig, scan: _Scan, seen: Optional[Counter], file_uri: str,
                line: int, label: str) -> None:
    """Count one label name of a row; `seen`: the training labels, which every evaluation
    label must be one of."""
    counts = scan.counts
    if label not in counts:
        if seen is not None and label not in seen:
            raise DataError(file_uri, f"label '{label}' never appears in the training data",
                            line=line, hint="the model cannot learn it; add training "
                                            "examples or drop these rows")
        if cfg.labels is not None and label not in cfg.labels:  # multi-label names
            raise DataError(file_uri, f"label '{label}' is not one of the allowed labels "
                                      f"{cfg.labels}", line=line,
                            hint="fix the row, or add the label to the 'labels' setting")
        if len(counts) >= MAX_LABELS:
            raise DataError(file_uri, f"more than {MAX_LABELS} distinct values in label "
                                      f"column '{cfg.label_column}'", line=line,
                            hint=f"are label_column ('{cfg.label_column}') and text_column "
                                 f"('{cfg.text_column}') swapped?")
        scan.first_line[label] = (file_uri, line)
    counts[label] += 1


def _write_rows(cfg: RunConfig, scan: _Scan, index: dict[str, int],
                writers: dict[str, SplitWriter], router: Optional[Router] = None,
                split: str = "train", check: Optional[leakage.LeakageCheck] = None) -> None:
    """Pass 2: read the files of `scan` again and append each row to `split`, or with a
    `router` to the split of the row's role; `check` sees every row written."""
    kind = task_kind(cfg.task)
    for file_uri, sha256 in scan.files:
        table, rows = iter_rows(cfg, file_uri)
        for _, text, pair, value in rows:
            row = PreparedRow(text, pair, kind.prepare(value, index))
            names = [index[n] for n in kind.names(value)]
            to = router.role(text, pair, kind.stratum(value)) if router else split
            writers[to].add(row, names)
            if check is not None:
                check.add(to, text, pair)
        if table.stream.sha256 != sha256:
            raise DataError(file_uri, "the file changed while it was being read",
                            hint="run the step again once the file is complete")


# --- reading -----------------------------------------------------------------------------
def _input_uris(cfg: RunConfig) -> list[str]:
    return [cfg.train_uri] + list(data_roles.role_files(cfg).values())


def _wanted_columns(cfg: RunConfig) -> list[str]:
    return [c for c in (cfg.text_column, cfg.text_pair_column, cfg.label_column) if c]


def _file_format(cfg: RunConfig, uri: str) -> str:
    return text_readers.format_of(uri, cfg.file_format)


# --- validation across rows ----------------------------------------------------------------
def _vocabulary(cfg: RunConfig, scan: _Scan) -> list[str]:
    """cfg.labels in its order if given, else the sorted distinct training labels; rejects a
    single class and a label column that holds free text."""
    counts = scan.counts
    kind = task_kind(cfg.task)
    if not kind.names_labels:  # regression: one output, named after the column
        return [cfg.label_column]
    if len(counts) < 2:
        raise DataError(scan.uri, f"only one class ({next(iter(counts))!r}) in column "
                                  f"'{cfg.label_column}'; a classifier needs at least 2",
                        hint="check label_column, or add examples of the other classes")
    _reject_free_text_labels(cfg, scan)
    mismatch = kind.check_labels(counts, scan.rows, cfg.label_delimiter)
    if mismatch is not None:
        label = mismatch.label
        uri, line = scan.first_line[label]
        raise DataError(uri, mismatch.reason, line=line, hint=mismatch.hint)
    return list(cfg.labels) if cfg.labels is not None else sorted(counts)


def _reject_free_text_labels(cfg: RunConfig, scan: _Scan) -> None:
    """Labels that are mostly distinct multi-word strings are texts: columns swapped?

    Real label sets repeat (even 77 intents over 9k rows) and are rarely sentences, so both
    signs together mean the label column holds the texts.
    """
    distinct = len(scan.counts)
    with_spaces = sum(1 for label in scan.counts if " " in label)
    if distinct >= 5 and distinct > 0.5 * scan.rows and with_spaces > 0.5 * distinct:
        label = next(label for label in scan.counts if " " in label)
        uri, line = scan.first_line[label]
        raise DataError(
            uri, f"label column '{cfg.label_column}' looks like free text: {distinct} "
                 f"distinct values in {scan.rows} rows, most with spaces (e.g. "
                 f"{label[:60]!r})", line=line,
            hint=f"are label_column ('{cfg.label_column}') and text_column "
                 f"('{cfg.text_column}') swapped?")


def _describe(scan: _Scan) -> dict:
    return {"uri": scan.uri, "sha256": combined_sha256(scan.files),
            "files": [{"uri": uri, "sha256": sha256} for uri, sha256 in scan.files]}
