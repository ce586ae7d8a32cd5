"""The data step for token classification (named entities): read, validate and split
sentences of tagged tokens, write them as prepared shards.

Inputs (tasks/io/token_readers.py): CoNLL-style files (.conll, .bio, .iob, .iob2, or
file_format conll), one token per line with its tag in column `tag_column` (the last by
default); or JSON Lines with a list of tokens and a list of tags per line, read from
`text_column` and `label_column`, or `tokens` and `tags` while those are left at their
defaults. Tags are BIO (IOB2). Same two streaming passes as tasks/steps/data.py:
1. validate every sentence, count the tags (the tag vocabulary, the split's quota), hash
   each file;
2. read again, assign each sentence to its split, append it to the split's shard.

The tag vocabulary is `labels` if set, else "O" then B-/I- of every entity type seen in
training (tasks.io.token_readers.tag_vocabulary). An evaluation tag outside it is an error.
A train file given alone is split by sentence (tasks/steps/split_rule.py, all sentences one
stratum). Outputs: `{split}-{i:05d}.jsonl` shards of `{"words": [...], "tags": [tag index,
...]}` (tasks.steps.prepared.TokenRow) and the data manifest.
"""
from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

from tasks import class_weights
from tasks.config import RunConfig
from tasks.errors import DataError
from tasks.io import storage, text_readers, token_readers
from tasks.io.chunked_reader import BLOCK_SIZE
from tasks.io.token_readers import Sentence
from tasks.io.uris import combined_sha256
from tasks.runs import runlayout
from tasks.runs.runlayout import RunContext
from tasks.steps import data_roles, leakage
from tasks.training import checkpoint
from tasks.steps.prepared import SplitWriter, TokenRow
from tasks.steps.split_rule import Router, Splitter

SPLIT_RULE = ("by sentence: exactly min(n-1, max(1, round(n*eval_fraction))) sentences, "
              "chosen by selection sampling on a seeded hash of each sentence")


@dataclass
class _Scan:
    uri: str
    files: list[tuple[str, str]] = field(default_factory=list)  # (uri, sha256)
    tags: Counter = field(default_factory=Counter)  # tokens carrying each tag
    sentences: int = 0
    first_line: dict = field(default_factory=dict)  # tag -> (uri, line) first seen


# --- reading -----------------------------------------------------------------------------
def file_format(cfg: RunConfig, uri: str) -> str:
    """"conll" or "jsonl": file_format unless auto, else from the extension. CSV/TSV
    cannot hold a tag per token: naming one is the wrong task (or the wrong file)."""
    fmt = cfg.file_format
    if fmt == "auto":
        name = uri.rsplit("/", 1)[-1].lower()
        if name.endswith(text_readers.CONLL_EXTENSIONS):
            return "conll"
        fmt = text_readers.format_of(uri)
    if fmt in ("csv", "tsv"):
        raise DataError(uri, f"token_classification reads tagged tokens: CoNLL files or "
                             f"JSON Lines with token and tag lists, not {fmt.upper()}",
                        hint="set task to classification for a label per text, or convert "
                             "the file to CoNLL (.conll)")
    return fmt


def json_columns(cfg: RunConfig) -> tuple[str, str]:
    """The JSON Lines fields holding the tokens and the tags."""
    fields = RunConfig.model_fields
    tokens = "tokens" if cfg.text_column == fields["text_column"].default else cfg.text_column
    tags = "tags" if cfg.label_column == fields["label_column"].default else cfg.label_column
    return tokens, tags


def sentences(cfg: RunConfig, uri: str,
              block_size: int = BLOCK_SIZE) -> tuple[Callable[[], str], Iterator[Sentence]]:
    """(sha256 of the file once read, its sentences `(line, tokens, tags)`)."""
    if file_format(cfg, uri) == "conll":
        stream = token_readers.open_stream(uri, block_size)
        return (lambda: stream.sha256), token_readers.conll_sentences(
            uri, cfg.tag_column, stream=stream)
    tokens, tags = json_columns(cfg)
    table = text_readers.open_table(uri, "jsonl", [tokens, tags], block_size)
    return (lambda: table.stream.sha256), token_readers.jsonl_sentences(
        uri, tokens, tags, table=table)


def _files(cfg: RunConfig, uri: str) -> list[str]:
    return text_readers.data_files(uri, cfg.file_format)


# --- the step ------------------------------------------------------------------------------
def check_inputs(cfg: RunConfig, block_size: int, max_sentences: int) -> None:
    """validate's pre-flight: each input file exists, is tagged text, and its first
    `max_sentences` sentences read (about the first `block_size` bytes)."""
    for pattern in [cfg.train_uri] + list(data_roles.role_files(cfg).values()):
        for uri in _files(cfg, pattern):
            _, found = sentences(cfg, uri, block_size)
            if not list(itertools.islice(found, max_sentences)):
                raise DataError(uri, "no sentences", line=1)


def run(cfg: RunConfig, ctx: RunContext) -> str:
    """Validate and split the sentences, write the prepared shards; return the manifest."""
    train = _scan(cfg, cfg.train_uri)
    labels = _vocabulary(cfg, train)
    class_weights.check_labels(cfg.class_weights, labels, cfg.train_uri)
    given = {split: _scan(cfg, uri, known=set(labels))
             for split, uri in data_roles.role_files(cfg).items()}
    router = Router({"": train.sentences}, None if "eval" in given else cfg.eval_fraction,
                    0.0 if "validation" in given else cfg.validation_share, cfg.seed)
    data_roles.check_quotas(cfg, router, "sentences")

    step = ctx.step_uri("data")
    storage.delete_prefix(step)  # a retry rewrites the folder
    index = {tag: i for i, tag in enumerate(labels)}
    writers = {name: SplitWriter(step, name, labels)
               for name in data_roles.split_names(cfg)}
    check = leakage.LeakageCheck(checkpoint.run_casing(cfg))
    _write(cfg, train, index, writers, router, check=check)
    for split, scan in given.items():
        _write(cfg, scan, index, writers, split=split, check=check)
    splits = {name: writer.close() for name, writer in writers.items()}
    leaked = leakage.report(check, splits["eval"]["shards"], TokenRow, cfg.fail_on_leakage,
                            cfg.test_data_uri or cfg.train_uri)
    manifest = {
        "task": cfg.task, "labels": labels, "has_pair": False,
        "tag_scheme": "BIO",
        **data_roles.role_sources(cfg, "validation" in writers),
        "splits": splits,
        "leakage": leaked,
        "sources": {"train": _describe(train),
                    **data_roles.held_out_sources(writers, given, _describe)},
    }
    rule = data_roles.split_rule(cfg, router, SPLIT_RULE)
    if rule:
        manifest["split_rule"] = rule
    return runlayout.write_manifest(step, manifest)


def sentence_splitter(num_sentences: int, eval_fraction: float, seed: int) -> Splitter:
    """The data step's streaming split rule with all sentences as one stratum (a sentence
    has no single label); call `to_eval` once per sentence in file order."""
    return Splitter({"": num_sentences}, eval_fraction, seed)


def to_eval(splitter: Splitter, words: list[str], tags: list[str]) -> bool:
    return splitter.to_eval(" ".join(words), " ".join(tags), "")


def split_sentences(found: list[Sentence], eval_fraction: float,
                    seed: int) -> tuple[list[Sentence], list[Sentence]]:
    """(train, eval) of a list of sentences by the step's rule, each in input order (small
    data, tests)."""
    splitter = sentence_splitter(len(found), eval_fraction, seed)
    train, evals = [], []
    for sentence in found:
        (evals if to_eval(splitter, sentence[1], sentence[2]) else train).append(sentence)
    return train, evals


def _scan(cfg: RunConfig, uri: str, known: Optional[set] = None) -> _Scan:
    """Pass 1: every sentence of `uri`'s files validated, its tags counted. `known`: the
    tag vocabulary, which every evaluation tag must be in."""
    scan = _Scan(uri)
    allowed = set(cfg.labels) if cfg.labels is not None else None
    for file_uri in _files(cfg, uri):
        sha256, found = sentences(cfg, file_uri)
        for line, _, tags in found:
            scan.sentences += 1
            for tag in tags:
                if tag not in scan.tags:
                    _check_new_tag(cfg, file_uri, line, tag, known, allowed)
                    scan.first_line[tag] = (file_uri, line)
                scan.tags[tag] += 1
        scan.files.append((file_uri, sha256()))
    return scan


def _check_new_tag(cfg: RunConfig, uri: str, line: int, tag: str, known: Optional[set],
                   allowed: Optional[set]) -> None:
    if allowed is not None and tag not in allowed:
        raise DataError(uri, f"tag '{tag}' (in the sentence from this line) is not one of "
                             f"the allowed labels {cfg.labels}", line=line, hint="fix the tag, or add it to the 'labels' setting")
    if known is not None and tag not in known:
        raise DataError(uri, f"tag '{tag}' (in the sentence from this line) never appears in "
                             f"the training data", line=line,
                        hint="the model cannot learn its entity type; add training "
                             "sentences or retag")


def _vocabulary(cfg: RunConfig, scan: _Scan) -> list[str]:
    labels = (list(cfg.labels) if cfg.labels is not None
              else token_readers.tag_vocabulary(scan.tags))
    if token_readers.OUTSIDE not in labels:
        raise DataError(cfg.train_uri, f"the labels setting {labels} has no "
                                       f"'{token_readers.OUTSIDE}' tag",
                        hint="BIO tags mark tokens outside every entity with O; add it")
    if not any(tag != token_readers.OUTSIDE for tag in scan.tags):
        raise DataError(cfg.train_uri, "no entity tags: every token is tagged O",
                        line=scan.first_line.get("O", (None, None))[1],
                        hint="check tag_column (the column of the tags, -1 the last)")
    return labels


def _write(cfg: RunConfig, scan: _Scan, index: dict[str, int],
           writers: dict[str, SplitWriter], router: Optional[Router] = None,
           split: str = "train", check: Optional[leakage.LeakageCheck] = None) -> None:
    """Pass 2: read the files again, append each sentence to `split`, or with a `router`
    to the split of its role; `check` sees every sentence written."""
    for file_uri, expected in scan.files:
        sha256, found = sentences(cfg, file_uri)
        for _, words, tags in found:
            ids = [index[tag] for tag in tags]
            to = router.role(" ".join(words), " ".join(tags), "") if router else split
            writers[to].add(TokenRow(words, ids), ids)
            if check is not None:
                check.add(to, " ".join(words), None)
        if sha256() != expected:
            raise DataError(file_uri, "the file changed while it was being read",
                            hint="run the step again once the file is complete")


def _describe(scan: _Scan) -> dict:
    return {"uri": scan.uri, "sha256": combined_sha256(scan.files),
            "files": [{"uri": uri, "sha256": sha256} for uri, sha256 in scan.files]}
