"""Readers of token-labelled text (named entities): CoNLL-style files and JSON Lines, from any
URI `tasks.io.storage` reads, streamed in bounded memory (`tasks.io.chunked_reader` blocks).

Both yield `(line, tokens, tags)` per sentence, `line` being the file line of its first
token (CoNLL) or of its record (JSON Lines), as an editor counts them from 1.

- CoNLL: one token per line, its tag in `tag_column` (the last by default) and the token in
  `token_column` (the first); fields are tab-separated when the line holds a tab, else split
  on runs of spaces. Sentences are separated by empty or whitespace-only lines (WNUT17's hold
  a lone tab; a lone byte-order mark counts as whitespace); a `-DOCSTART-` line is skipped
  and also ends the sentence before it.
- JSON Lines: one object per line with a list of tokens and a list of tags of the same length
  (`tokens` and `tags` by default).

Tags must be in the BIO (IOB2) scheme: `O`, `B-TYPE` or `I-TYPE`. An `I-TYPE` after `O` or
after another type is kept as written: like conlleval.pl and seqeval's default mode, the
metric (tasks/training/entity_metrics.py) reads it as the start of a new entity. Every problem
is a `DataError` naming the file and line and what to do.
"""
from __future__ import annotations

from typing import Iterable, Iterator

from tasks.errors import DataError
from tasks.io import storage, text_readers
from tasks.io.chunked_reader import BLOCK_SIZE, TextStream

OUTSIDE = "O"
DOCSTART = "-DOCSTART-"
Sentence = tuple[int, list[str], list[str]]  # (line, tokens, tags)


def check_tag(uri: str, line: int, tag: str) -> None:
    prefix, dash, kind = tag.partition("-")
    if tag != OUTSIDE and not (prefix in ("B", "I") and dash and kind.strip() == kind != ""):
        raise DataError(uri, f"tag {tag!r} is not in the BIO scheme (O, B-TYPE, I-TYPE)",
                        line=line, hint="convert IOB1/BIOES tags to BIO (IOB2) first")


def open_stream(uri: str, block_size: int = BLOCK_SIZE) -> TextStream:
    """`uri`'s text, read lazily; its `sha256` is known once the sentences are read."""
    if not storage.exists(uri):
        raise DataError(uri, "file not found", hint="check train_uri / eval_uri")
    return TextStream(uri, storage.iter_bytes(uri, block_size))


def conll_sentences(uri: str, tag_column: int = -1, token_column: int = 0,
                    block_size: int = BLOCK_SIZE,
                    stream: TextStream | None = None) -> Iterator[Sentence]:
    """Sentences of the CoNLL-style file `uri` (see the module docstring); `stream`: the
    file opened by `open_stream`, to read its sha256 afterwards."""
    stream = stream or open_stream(uri, block_size)
    tokens: list[str] = []
    tags: list[str] = []
    first = 0
    any_sentence = False
    for number, raw in enumerate(stream.lines(), start=1):
        text = raw.rstrip("\r\n")
        # A stray byte-order mark (U+FEFF) is not whitespace to str.strip(); WNUT17's dev
        # file ends with a line holding only one.
        if not text.replace("\ufeff", "").strip() or text.split()[0] == DOCSTART:
            if tokens:
                any_sentence = True
                yield first, tokens, tags
                tokens, tags = [], []
            continue
        fields = [f.strip() for f in text.split("\t")] if "\t" in text else text.split()
        try:
            tag, token = fields[tag_column], fields[token_column]
        except IndexError:
            tag = token = ""
        if len(fields) < 2 or not tag or not token:
            raise DataError(uri, f"expected a token and its tag (column {tag_column}), found "
                                 f"{len(fields)} field(s): {text.strip()!r}", line=number,
                            hint="separate token and tag by a tab or a space; separate "
                                 "sentences by an empty line")
        check_tag(uri, number, tag)
        if not tokens:
            first = number
        tokens.append(token)
        tags.append(tag)
    if tokens:
        any_sentence = True
        yield first, tokens, tags
    if not any_sentence:
        raise DataError(uri, "no sentences (only -DOCSTART- lines)", line=1)


def jsonl_sentences(uri: str, tokens_column: str = "tokens", tags_column: str = "tags",
                    block_size: int = BLOCK_SIZE,
                    table: text_readers.Table | None = None) -> Iterator[Sentence]:
    """Sentences of the JSON Lines file `uri`: each object's `tokens_column` and
    `tags_column`, lists of strings of the same length; `table`: the file opened by
    `text_readers.open_table`, to read its sha256 afterwards."""
    table = table or text_readers.open_table(uri, "jsonl", [tokens_column, tags_column],
                                             block_size)
    for line, record in table.records:
        tokens, tags = record.get(tokens_column), record.get(tags_column)
        for name, value in ((tokens_column, tokens), (tags_column, tags)):
            if not isinstance(value, list) or not value or not all(
                    isinstance(item, str) and item.strip() for item in value):
                raise DataError(uri, f"field '{name}' must be a non-empty list of non-empty "
                                     f"strings", line=line,
                                hint="integer tag ids must be mapped to their names first")
        if len(tokens) != len(tags):
            raise DataError(uri, f"{len(tokens)} tokens but {len(tags)} tags", line=line,
                            hint="give every token exactly one tag")
        for tag in tags:
            check_tag(uri, line, tag)
        yield line, tokens, tags


def tag_vocabulary(tags: Iterable[str]) -> list[str]:
    """The labels in model output order: "O" first, then the B- and I- tags sorted, every
    entity type seen with both its B- and its I- tag (a type seen only as B-X still gets
    I-X, so that predictions can continue its entities)."""
    types = {tag[2:] for tag in tags if tag != OUTSIDE}
    return [OUTSIDE] + sorted(f"{prefix}-{kind}" for kind in types for prefix in "BI")

