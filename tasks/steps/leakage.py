"""Test rows that also appear in the training rows: a test figure over them measures memory,
not generalization. The data step counts them (exact text match after the tokenizer's
normalization), records the count and three examples in its manifest, warns, and with
`fail_on_leakage` refuses the data.

The normalization is BERT's basic tokenization, which decides what the model sees (the
`tokenizers` library's, as BertTokenizerFast runs it): control characters dropped,
whitespace collapsed, CJK ideographs and punctuation split off as tokens, lower-cased and
accents stripped as the checkpoint's casing says (tasks/model/casing.py: some lower-casing
checkpoints keep accents; byte-level BPE and SentencePiece keep both). Two rows match when their token sequences (and
their pairs') are equal. Memory: 8 bytes per training and test row (a keyed
hash), not the texts.
"""
from __future__ import annotations

import functools
import hashlib
import itertools
from array import array
from typing import Optional

import numpy as np

from tasks.errors import DataError
from tasks.model.casing import Casing
from tasks.steps import prepared

EXAMPLES = 3


def basic_tokens(text: str, lower_case: bool, strip_accents: bool) -> list[str]:
    """BERT's basic tokens of `text`: the `tokenizers` library's BertNormalizer and
    BertPreTokenizer, the normalization BertTokenizerFast applies before WordPiece."""
    normalizer, pre_tokenizer = _bert_normalization(lower_case, strip_accents)
    return [token for token, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))]


@functools.lru_cache(maxsize=4)
def _bert_normalization(lower_case: bool, strip_accents: bool):
    from tokenizers.normalizers import BertNormalizer
    from tokenizers.pre_tokenizers import BertPreTokenizer

    return (BertNormalizer(clean_text=True, handle_chinese_chars=True,
                           strip_accents=strip_accents, lowercase=lower_case),
            BertPreTokenizer())


def row_key(text: str, pair: Optional[str], lower_case: bool, strip_accents: bool) -> int:
    """The 64-bit key of a row's normalized text (and pair)."""
    normalized = " ".join(basic_tokens(text, lower_case, strip_accents))
    if pair is not None:
        normalized += "\0" + " ".join(basic_tokens(pair, lower_case, strip_accents))
    return int.from_bytes(hashlib.blake2b(normalized.encode(), digest_size=8).digest(),
                          "little")


class LeakageCheck:
    """Feed every written row with `add(split, text, pair)`; `leaked()` then gives the
    indexes, in write order, of the test (eval split) rows whose key a training row has."""

    def __init__(self, casing: Casing):
        self.lower_case, self.strip_accents = casing.lower_case, casing.strips_accents
        self.keys = {"train": array("Q"), "eval": array("Q")}

    def add(self, split: str, text: str, pair: Optional[str]) -> None:
        if split in self.keys:
            self.keys[split].append(row_key(text, pair, self.lower_case, self.strip_accents))

    def leaked(self) -> np.ndarray:
        # Sorted in place (the array's own buffer) and searched: no copy of the train keys.
        train = np.frombuffer(self.keys["train"], dtype=np.uint64)
        train.sort()
        test = np.frombuffer(self.keys["eval"], dtype=np.uint64)
        at = np.minimum(np.searchsorted(train, test), max(len(train) - 1, 0))
        return np.flatnonzero(train[at] == test) if len(train) else np.array([], np.int64)


def report(check: LeakageCheck, test_shards: list[str], row_type, fail: bool,
           test_source: str) -> dict:
    """The data manifest's `leakage` entry: the count of test rows found in training and up
    to EXAMPLES of them (read back from the written test shards); a printed warning when
    there are any, and with `fail` a DataError naming the test source."""
    leaked = check.leaked()
    examples: list[str] = []
    if len(leaked):
        wanted = set(leaked[:EXAMPLES].tolist())
        rows = itertools.chain.from_iterable(
            prepared.read_prepared_rows(test_shards, row_type=row_type))
        for index, row in enumerate(rows):
            if index in wanted:
                examples.append(_shown(row))
                if len(examples) == len(wanted):
                    break
        shown = "; ".join(repr(e) for e in examples)
        message = (f"{len(leaked)} test rows also appear in the training data (same text "
                   f"after BERT's normalization), e.g. {shown}")
        if fail:
            raise DataError(test_source, message, hint="remove them from the training or the "
                                                       "test data, or turn fail_on_leakage off")
        print(f"data: warning: {message}; their test figure measures memory", flush=True)
    return {"test_rows_in_train": int(len(leaked)), "examples": examples}


def _shown(row) -> str:
    text = " ".join(row.words) if hasattr(row, "words") else row.text
    pair = getattr(row, "text_pair", None)
    text = text if pair is None else f"{text} / {pair}"
    return text if len(text) <= 80 else text[:77] + "..."
