"""The data step's split of a train file given alone: seeded, stratified, streaming.

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

    def __init__(self, counts: dict[str, int], eval_fraction: float, seed: int):
        self.quotas = eval_quotas(counts, eval_fraction)
        self.left = dict(counts)  # rows of the class not seen yet
        self.need = dict(self.quotas)  # eval rows still to take
        self._key = hashlib.sha256(f"bertflow-split-{seed}".encode()).digest()[:32]

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
