"""Whether a checkpoint's tokenizer lower-cases its input, read from the checkpoint.

A cased vocabulary fed lower-cased, accent-stripped text never reaches its capitalised
pieces ("The", "Paris", "É"), and an uncased one fed capitals maps them to [UNK]: the setting
belongs to the checkpoint, not to the run. In order, the first that answers:

1. `tokenizer_config.json`'s `do_lower_case` (what transformers' BertTokenizer reads, and
   what wins over tokenizer.json when both are present);
2. `tokenizer.json`'s normalizer (`BertNormalizer.lowercase`, or a `Lowercase` step);
3. the vocabulary: pieces with capitals (beyond the bracketed specials) cannot be produced
   by a lower-casing tokenizer, so a vocabulary with many is cased; one with none is uncased;
4. the family's default: transformers' BertTokenizer lower-cases unless told otherwise, and
   DistilBERT's and ELECTRA's tokenizers are BertTokenizer's.

RoBERTa's byte-level BPE and XLM-R's SentencePiece model have no casing option: they read text as
it is (XLM-R's normalizer, nmt_nfkc, keeps capitals), whatever the files say. DeBERTa-v3's
tokenizer has one (`do_lower_case`, false in its tokenizer_config.json); bertflow's in-graph
SentencePiece does not lower-case, so a checkpoint that sets it true is refused.

Accents are read with the casing, from the same file: `tokenizer_config.json`'s
`strip_accents`, or the normalizer's (`BertNormalizer.strip_accents`, a `StripAccents` step).
Unset, they follow lower-casing, as in transformers' BertNormalizer; some multilingual,
German and Turkish checkpoints lower-case and keep accents. `Casing.strip_accents` is None
unless it differs from `lower_case`, so a run of a checkpoint without the distinction keeps
its tokenize cache key; the in-graph WordPiece (tasks/model/wordpiece_normalizer.py) applies
it and the HF export writes it back.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from tasks.errors import ConfigError
from tasks.model.families import CASED_ONLY, FAMILIES, NO_OPTION, Family

TOKENIZER_CONFIG = "tokenizer_config.json"
TOKENIZER_JSON = "tokenizer.json"
FILES = (TOKENIZER_CONFIG, TOKENIZER_JSON)  # optional files fetched with a checkpoint
# A vocabulary is cased when at least this share of its pieces has a capital letter
# (bert-base-cased: ~20%; multilingual cased: ~25%); uncased ones have none.
CASED_VOCAB_SHARE = 0.01


@dataclass(frozen=True)
class Casing:
    lower_case: bool
    rule: str  # where the value came from, for the tokenize manifest and errors
    from_checkpoint: bool  # False: the family's default (the checkpoint did not say)
    # Whether accents are stripped, only where it differs from lower_case (None: as it).
    strip_accents: Optional[bool] = None

    @property
    def strips_accents(self) -> bool:
        return self.lower_case if self.strip_accents is None else self.strip_accents


def read(folder: Path | str, family: str) -> Casing:
    """The casing of a checkpoint folder on local disk."""
    folder = Path(folder)

    def read_file(name: str) -> Optional[bytes]:
        path = folder / name
        return path.read_bytes() if path.is_file() else None

    return from_files(read_file, family, str(folder))


def from_files(read_file: Callable[[str], Optional[bytes]], family: str,
               where: str) -> Casing:
    """The casing from a checkpoint's files; `read_file(name)` gives a file's bytes or None
    when the checkpoint has no such file. `where` names the checkpoint in errors. The
    family's row (families.Family.casing) says whether the files are read: a tokenizer
    without the option never lower-cases (casing_reason says why, the tokenize manifest's
    lower_case_rule); a cased-only one is read for the option only."""
    row = FAMILIES[family]
    if row.casing == NO_OPTION:
        return Casing(False, f"{family}: {row.casing_reason}", True)
    config = _json(read_file, TOKENIZER_CONFIG, where)
    if row.casing == CASED_ONLY:
        return _cased_setting(config, row, where)
    if config is not None and config.get("do_lower_case") is not None:
        lower = bool(config["do_lower_case"])
        return Casing(lower, f"{TOKENIZER_CONFIG} do_lower_case", True,
                      _differing(config.get("strip_accents"), lower))
    tokenizer = _json(read_file, TOKENIZER_JSON, where)
    found = _normalizer_casing(tokenizer.get("normalizer")) if tokenizer else None
    if found is not None:
        lower, strip_accents = found
        return Casing(lower, f"{TOKENIZER_JSON} normalizer", True,
                      _differing(strip_accents, lower))
    vocab = read_file("vocab.txt")
    if vocab is not None:
        pieces = [p for p in vocab.decode("utf-8", "replace").splitlines()
                  if p and not (p.startswith("[") and p.endswith("]"))]
        capitals = sum(1 for p in pieces if any(c.isupper() for c in p))
        if capitals == 0 and pieces:
            return Casing(True, "vocab.txt has no capitalised pieces", True)
        if pieces and capitals >= CASED_VOCAB_SHARE * len(pieces):
            return Casing(False, f"vocab.txt: {capitals} of {len(pieces)} pieces have "
                                 "capitals", True)
    # The checkpoint does not say: transformers' BertTokenizer lower-cases.
    return Casing(True, f"{family} default (the checkpoint does not say)", False)


def _cased_setting(config: Optional[dict], row: Family, where: str) -> Casing:
    """A tokenizer that may lower-case (DebertaV2Tokenizer's do_lower_case, false unless
    set): bertflow runs only the cased setting; the row's casing_reason says why the text
    keeps its case when the files say nothing."""
    if config is not None and config.get("do_lower_case"):
        raise ConfigError("base_model", (
            f"{where}/{TOKENIZER_CONFIG}: do_lower_case true; bertflow's in-graph "
            f"SentencePiece tokenizer does not lower-case, so this {row.name} checkpoint's "
            f"tokenization cannot be reproduced; use a cased checkpoint (DeBERTa-v3's are)"))
    if config is not None and config.get("do_lower_case") is not None:
        return Casing(False, f"{TOKENIZER_CONFIG} do_lower_case", True)
    return Casing(False, f"{row.name}: {row.casing_reason}", True)


def decide(explicit: Optional[bool], override: bool, found: Casing) -> Casing:
    """The run's casing: the checkpoint's, unless `lower_case` is set. A value that
    contradicts what the checkpoint says is refused unless `lower_case_override`."""
    if explicit is None or explicit == found.lower_case:
        return found
    if found.from_checkpoint and not override:
        raise ConfigError("lower_case", (
            f"{str(explicit).lower()} contradicts the checkpoint ({found.rule}: "
            f"{'lower-cased' if found.lower_case else 'cased'}); leave lower_case empty to "
            f"follow the checkpoint, or set lower_case_override to train with "
            f"{str(explicit).lower()} anyway"))
    # The checkpoint's accents stay where they were set apart from its casing.
    return Casing(explicit, f"lower_case {str(explicit).lower()} set for the run "
                            f"(the checkpoint: {found.rule}, "
                            f"{'lower-cased' if found.lower_case else 'cased'})", False,
                  _differing(found.strip_accents, explicit))


def _json(read_file, name: str, where: str) -> Optional[dict]:
    raw = read_file(name)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError as err:
        raise ConfigError("base_model", f"{where}/{name} is not JSON ({err}); fix or remove "
                                        "it") from None
    return value if isinstance(value, dict) else None


def _normalizer_casing(normalizer) -> Optional[tuple[bool, Optional[bool]]]:
    """(lower-cases, strip_accents or None) of a tokenizers normalizer, or None when it is not
    one bertflow reads (no normalizer: nothing said)."""
    if not isinstance(normalizer, dict):
        return None
    kind = normalizer.get("type")
    if kind == "BertNormalizer":
        return bool(normalizer.get("lowercase", True)), normalizer.get("strip_accents")
    if kind == "Sequence":
        steps = [s for s in normalizer.get("normalizers", []) if isinstance(s, dict)]
        bert = next((s for s in steps if s.get("type") == "BertNormalizer"), None)
        if bert is not None:
            return _normalizer_casing(bert)
        kinds = {s.get("type") for s in steps}
        return "Lowercase" in kinds, "StripAccents" in kinds
    if kind == "Lowercase":
        return True, False  # a lone Lowercase step keeps accents
    return None


def _differing(strip_accents, lower: bool) -> Optional[bool]:
    """strip_accents where set and not what lower-casing implies, else None."""
    if strip_accents is None or bool(strip_accents) == lower:
        return None
    return bool(strip_accents)
