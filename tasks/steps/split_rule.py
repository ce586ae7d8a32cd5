"""The data step's split of a train file given alone: seeded, stratified, streaming.
`Router` applies it twice, for the test and then the validation rows.

Within each stratum (a class; a multi-label row's first label; one stratum for scores and for
sentences) of n >= 2 rows exactly k = min(n - 1, max(1, round(n * eval_fraction))) rows are
held out. Which rows: selection sampling (Knuth's Algorithm S) driven by a keyed hash of the
row: row i of its stratum goes to eval when hash(seed, stratum, text, pair) / 2**64 <
(k - taken) / (n - i). The draw depends only on the row's content and the seed, the quota
only on counts, so the split is deterministic and needs no list of rows.
"""
from __future__ import annotations

import hashlib
from typing import Optional


def eval_quotas(counts: dict[str, int], eval_fraction: float) -> dict[str, int]:
    """Rows each class holds out: round(n * eval_fraction), at least 1 and at most n - 1
    (a class with a single row stays in train only)."""
    return {label: (min(n - 1, max(1, int(n * eval_fraction + 0.5))) if n >= 2 else 0)
            for label, n in counts.items()}


class Splitter:
    """The streaming, seeded, stratified split: `to_eval(...)` for each row in file order.

    Selection sampling per class with each row's draw a keyed hash of its content: exactly
    `quotas[label]` of the `counts[label]` rows go to eval, whichever order the classes
    interleave in, and the same rows for the same data and seed.
    """

    def __init__(self, counts: dict[str, int], eval_fraction: float, seed: int,
                 salt: str = "split"):
        self.quotas = eval_quotas(counts, eval_fraction)
        self.left = dict(counts)  # rows of the class not seen yet
        self.need = dict(self.quotas)  # eval rows still to take
        # `salt` keeps the validation draw independent of the test draw.
        self._key = hashlib.sha256(f"bertflow-{salt}-{seed}".encode()).digest()[:32]

    def to_eval(self, text: str, pair: Optional[str], label: str) -> bool:
        need, left = self.need[label], self.left[label]
        self.left[label] = left - 1
        if need <= 0:
            return False
        draw = int.from_bytes(hashlib.blake2b(
            f"{label}\0{text}\0{'' if pair is None else pair}".encode(), digest_size=8,
            key=self._key).digest(), "little")
        if draw * left < need << 64:  # draw / 2**64 < need / left, in integers
            self.need[label] = need - 1
            return True
        return False


class Router:
    """The role of each training row when the test and the validation rows are carved from
    the training data: `role(...)` for each row in file order gives "eval" (test),
    "validation" or "train".

    Test is drawn first, by the Splitter alone, so turning validation on or off never
    changes the test rows; validation is then drawn the same way from the rows left, with
    a key of its own. `test_fraction` None: test comes from a file; `validation_fraction` 0:
    no validation rows.
    """

    def __init__(self, counts: dict[str, int], test_fraction: Optional[float],
                 validation_fraction: float, seed: int):
        self.test = Splitter(counts, test_fraction, seed) if test_fraction else None
        left = dict(counts)
        if self.test is not None:
            left = {label: n - self.test.quotas[label] for label, n in counts.items()}
        self.validation = (Splitter(left, validation_fraction, seed, salt="validation")
                           if validation_fraction else None)

    def quota(self, role: str) -> int:
        splitter = self.test if role == "eval" else self.validation
        return sum(splitter.quotas.values()) if splitter is not None else 0

    def role(self, text: str, pair: Optional[str], label: str) -> str:
        if self.test is not None and self.test.to_eval(text, pair, label):
            return "eval"
        if self.validation is not None and self.validation.to_eval(text, pair, label):
            return "validation"
        return "train"
