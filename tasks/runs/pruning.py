"""A sweep's early pruning: a trial that validates worse than its peers stops there.

Each trial evaluates on the validation rows during training (tasks/training/validation.py)
and writes every evaluation to its `train/history.json` as it ends. At each of its
evaluations, a trial of a sweep with `sweep_pruning` compares its value with the values the
other trials recorded at the same optimizer step:

- `median` (the median stopping rule, Golovin et al. 2017, Vizier; Optuna's MedianPruner):
  stop when the value is below the median of the other trials' values at that step. At
  least MIN_PEERS other trials must have reached the step.
- `asha` (asynchronous successive halving, Li et al. 2020): the rungs are the evaluations at
  unit * REDUCTION**k steps (unit: eval_every_steps, or the epoch's steps); at a rung, a
  trial goes on only if it is in the top 1/REDUCTION of the trials that reached it, itself
  included (at least REDUCTION of them).

Peers are read as they are when the trial gets there, so the decision depends on which trials
ran before (max_parallel_trials): that is what makes the rules asynchronous. Trials of other
batch sizes count other steps and are not peers. A pruned trial ends as pruned, not as a
failure; the sweep never picks it.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Optional

from tasks.io import storage
from tasks.io.uris import join_uri

RULES = ("none", "median", "asha")
MIN_PEERS = 2
REDUCTION = 3
TRIAL_MARK = "__trial-"  # trial run keys: {sweep key}__trial-NN (tasks/runs/sweep.py)


@dataclass(frozen=True)
class Pruner:
    """`check(step, value)`: the reason to stop this trial at `step`, or None."""

    rule: str
    metric: str
    peers: Callable[[int], list[float]]  # the other trials' values at a step
    unit: int  # steps between evaluations (asha's rungs)

    def check(self, step: int, value: float) -> Optional[str]:
        others = self.peers(step)
        if self.rule == "median":
            if len(others) < MIN_PEERS:
                return None
            median = statistics.median(others)
            if value < median:
                return (f"pruned at step {step}: {self.metric} {value:.4f} is below the "
                        f"median {median:.4f} of the {len(others)} other trials there "
                        "(median rule)")
            return None
        if self.rule == "asha" and self.is_rung(step):
            values = sorted(others + [value], reverse=True)
            if len(values) < REDUCTION:
                return None
            keep = max(1, len(values) // REDUCTION)
            if value < values[keep - 1]:
                return (f"pruned at step {step}: {self.metric} {value:.4f} is not in the "
                        f"top {keep} of the {len(values)} trials at this rung (asha, "
                        f"reduction {REDUCTION})")
        return None

    def is_rung(self, step: int) -> bool:
        if not self.unit or step % self.unit:
            return False
        k = step // self.unit
        while k % REDUCTION == 0:
            k //= REDUCTION
        return k == 1


def sweep_uri_of(run_uri: str) -> Optional[str]:
    """The sweep folder of a trial's run folder; None for a run that is no trial."""
    head, mark, tail = run_uri.rstrip("/").rpartition(TRIAL_MARK)
    return head if mark and tail.isdigit() else None


def peer_values(record: dict, own_run_uri: str, metric: str) -> Callable[[int], list[float]]:
    """A function of a step: the `metric` every other trial of the sweep (`record`: its
    sweep.json) recorded at that step (their train/history.json `validation`), read at each
    call."""
    others = [t["run_uri"] for t in record["trials"]
              if t["run_uri"].rstrip("/") != own_run_uri.rstrip("/")]

    def at(step: int) -> list[float]:
        values = []
        for run in others:
            uri = join_uri(run, "train", "history.json")
            history = storage.read_json(uri) if storage.exists(uri) else {}
            for record in history.get("validation") or []:
                if record.get("step") == step and isinstance(record.get(metric), (int, float)):
                    values.append(float(record[metric]))
                    break
        return values
    return at


def for_run(run_uri: str, metric: str, unit: int) -> Optional[Pruner]:
    """The Pruner of a trial whose sweep prunes (sweep.json's `pruning`); None otherwise."""
    sweep_uri = sweep_uri_of(run_uri)
    if sweep_uri is None or not storage.exists(join_uri(sweep_uri, "sweep.json")):
        return None
    record = storage.read_json(join_uri(sweep_uri, "sweep.json"))
    rule = record.get("pruning", "none")
    if rule == "none":
        return None
    return Pruner(rule, metric, peer_values(record, run_uri, metric), unit)
