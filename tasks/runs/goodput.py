"""Goodput of a train step: its wall time split into categories that sum to it exactly.

Inputs (no Cloud Logging): `{run}/train/attempts.json`, written by the controller (one record
per provisioning attempt: requested_at, running_at, ended_at, outcome), and the chief's
`{run}/train/goodput/attempt-{n}-{role}-{index}.json` (tasks/training/goodput_clock.py).

Categories follow Google's ml-goodput-measurement (`BadputType` in ml_goodput_measurement/
src/goodput.py); productive time is its `GoodputType.TOTAL`:

- waiting_for_capacity_s: requested_at -> running_at of each attempt, and the gaps between
  attempts (INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION, and scheduling);
- startup_s: process start -> first step: imports, strategy, model build, restore
  (PROGRAM_STARTUP, TRAINING_PREP);
- productive_s: optimizer steps done for the first time (GoodputType.TOTAL);
- checkpoint_s: checkpoint saves and the final model save (UNPRODUCTIVE_CHECKPOINT_SAVE_TIME);
- evaluation_s: the evaluation after training, inside the train step (`evaluate_in_train`;
  0 when the evaluate step evaluates) (CUSTOM_BADPUT_EVENTS);
- data_wait_s: blocking input waits, where measured (DATA_LOADING_SYNC);
- recomputed_s: steps run again after a restore, and a lost attempt's unreported tail
  (WASTED_PROGRESS_FROM_DISRUPTION);
- other_s: the remainder, e.g. process exit and controller overhead (OTHER).

Goodput = productive_s / total_s, total_s = first requested_at -> last ended_at.
"""
from __future__ import annotations

from typing import Any

from tasks.io.uris import join_uri
from tasks.io import storage

ATTEMPTS = "attempts.json"
PARTS = ("waiting_for_capacity_s", "startup_s", "productive_s", "checkpoint_s",
         "evaluation_s", "data_wait_s", "recomputed_s", "other_s")
CHIEF_ROLES = ("chief-0", "worker-0")  # the PS chief, else MWMS worker 0 or a lone process


def combine(attempts: list[dict], chief_parts: dict[int, dict]) -> dict[str, Any]:
    """`attempts`: attempts.json records; `chief_parts`: attempt number -> the chief's parts.
    Every figure is kept in whole milliseconds so the parts add up to the total exactly."""
    attempts = sorted(attempts, key=lambda a: a["attempt"])
    ms = {key: 0 for key in PARTS}
    recomputed_steps = 0
    previous_end = None
    for record in attempts:
        requested, ended = _ms(record["requested_at"]), _ms(record["ended_at"])
        running = _ms(record["running_at"]) if record.get("running_at") is not None else ended
        if previous_end is not None:  # re-provisioning between attempts
            ms["waiting_for_capacity_s"] += max(0, requested - previous_end)
        ms["waiting_for_capacity_s"] += running - requested
        previous_end = ended
        parts = chief_parts.get(record["attempt"])
        if parts is None:
            continue
        span = ended - running
        used = 0
        for key in ("startup_s", "productive_s", "checkpoint_s", "evaluation_s", "data_wait_s",
                    "recomputed_s"):
            value = min(_ms(parts.get(key) or 0.0), span - used)  # never beyond the attempt
            ms[key] += value
            used += value
        recomputed_steps += parts.get("recomputed_steps") or 0
        if record.get("outcome") == "lost" and parts.get("written_at"):
            # Work after the last report died with the machine.
            tail = max(0, ended - max(_ms(parts["written_at"]), running))
            ms["recomputed_s"] += min(tail, span - used)
    total = (_ms(attempts[-1]["ended_at"]) - _ms(attempts[0]["requested_at"])) if attempts else 0
    ms["other_s"] = total - sum(ms[key] for key in PARTS if key != "other_s")
    out: dict[str, Any] = {key: value / 1000 for key, value in ms.items()}
    share = round(ms["productive_s"] / total, 4) if total else None
    return {"total_s": total / 1000, "goodput": share,
            "parts": out, "parts_ms": ms, "total_ms": total,
            "attempts": len(attempts),
            "preemptions": sum(1 for a in attempts if a.get("outcome") == "preempted"),
            "lost": sum(1 for a in attempts if a.get("outcome") == "lost"),
            "recomputed_steps": recomputed_steps}


def read_goodput(step_uri: str) -> dict[str, Any] | None:
    """The train step's goodput from its folder; None before any worker reported. Without an
    attempts.json (a controller that records none), each reported attempt counts from its
    chief's process start to its last report, with no wait for capacity."""
    chief_parts: dict[int, dict] = {}
    prefix = join_uri(step_uri, "goodput")
    for uri in storage.list_uris(prefix):
        name = uri.rstrip("/").rsplit("/", 1)[-1].removesuffix(".json")
        head, _, who = name.partition("-")[2].partition("-")
        if who in CHIEF_ROLES and head.isdigit():
            if int(head) not in chief_parts or who == "chief-0":
                chief_parts[int(head)] = storage.read_json(uri)
    if not chief_parts:
        return None
    attempts_uri = join_uri(step_uri, ATTEMPTS)
    if storage.exists(attempts_uri):
        attempts = storage.read_json(attempts_uri)
    else:
        attempts = [{"attempt": n, "requested_at": p["started_at"], "running_at": p["started_at"],
                     "ended_at": p["written_at"], "outcome": None}
                    for n, p in sorted(chief_parts.items())]
    return combine(attempts, chief_parts)


def describe(result: dict[str, Any] | None) -> str:
    """One line for the run page and the model card (after a "goodput" label)."""
    if not result or result.get("goodput") is None:
        return "not measured"
    parts = result["parts"]
    shown = ", ".join(f"{key.removesuffix('_s').replace('_', ' ')} {parts[key]:.1f} s"
                      for key in PARTS if parts[key])
    return (f"{100 * result['goodput']:.1f}% of {result['total_s']:.1f} s over "
            f"{result['attempts']} attempt(s) ({result['preemptions']} preempted, "
            f"{result['lost']} lost; {result['recomputed_steps']} steps recomputed): {shown}")


def _ms(seconds: float) -> int:
    return int(round(float(seconds) * 1000))
