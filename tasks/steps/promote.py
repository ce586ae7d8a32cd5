"""Promote step: a quality gate, then the champion pointer.

`{export_uri}/{model_name}/CHAMPION.json` names the current model:
`{"version", "version_uri", "metric", "value", "previous": {...}, "promoted_at", "dag_id",
"run_id"}`. It changes only by compare-and-swap (local: lock + rename; GCS: generation
precondition; S3: If-Match / If-None-Match), so two runs promoting at once cannot lose an
update: the loser re-reads the new champion, re-applies the gate and records it as previous.
A version that fails the gate stays published; the manifest says why it was not promoted.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone

from tasks.runs import runlayout
from tasks.io import storage
from tasks.config import RunConfig, join_uri
from tasks.errors import StorageError
from tasks.runs.runlayout import RunContext

CHAMPION = "CHAMPION.json"
ATTEMPTS = 10  # compare-and-swap rounds before giving up on a pointer that keeps moving


def champion_uri(cfg: RunConfig) -> str:
    return join_uri(cfg.resolved_export_uri(), cfg.model_name, CHAMPION)


def run(cfg: RunConfig, ctx: RunContext) -> str:
    exported = runlayout.read_manifest(ctx.manifest_uri("export"))
    version_uri = exported["version_uri"]
    if not storage.is_complete(version_uri):
        raise StorageError(f"{version_uri}: not a completely published version (no "
                           f"{storage.COMPLETE}); re-run the export step")
    value = float(storage.read_json(join_uri(version_uri, "metrics.json"))[cfg.gate_metric])
    pointer = champion_uri(cfg)

    for _ in range(ATTEMPTS):
        current = storage.read_versioned(pointer)
        champion = json.loads(current[0]) if current else None
        if champion and champion["version_uri"] == version_uri:  # a retry after promoting
            promoted, reason = True, f"{exported['version']} is already the champion"
            break
        promoted, reason = gate(cfg, value, champion)
        if not promoted:
            break
        record = {"version": exported["version"], "version_uri": version_uri,
                  "metric": cfg.gate_metric, "value": value,
                  "previous": _without_history(champion),
                  "promoted_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "dag_id": ctx.dag_id, "run_id": ctx.run_id}
        body = (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()
        if storage.write_if_match(pointer, body, current[1] if current else None):
            break
    else:
        raise StorageError(f"{pointer}: changed {ATTEMPTS} times while promoting; retry")

    return runlayout.write_manifest(ctx.step_uri("promote"), {
        "promoted": promoted, "reason": reason, "version_uri": version_uri,
        "version": exported["version"], "metric": cfg.gate_metric, "value": value,
        "champion_uri": pointer, "champion_before": champion})


def gate(cfg: RunConfig, value: float, champion: dict | None) -> tuple[bool, str]:
    """(promote?, why) for a new model scoring `value` on cfg.gate_metric."""
    metric = cfg.gate_metric
    if value < cfg.gate_min_value:
        return False, f"{metric} {value:.4f} is below gate_min_value {cfg.gate_min_value}"
    if champion is None:
        return True, f"{metric} {value:.4f}; no champion yet"
    best = _champion_value(champion, metric)
    comparison = f"{metric} {value:.4f} vs champion {champion['version']} {best:.4f}"
    if value < best - cfg.gate_max_regression:
        return False, f"{comparison}: regresses by more than gate_max_regression " \
                      f"{cfg.gate_max_regression}"
    return True, comparison


def _champion_value(champion: dict, metric: str) -> float:
    # A champion promoted under another gate metric is compared on this run's metric.
    if champion["metric"] == metric:
        return float(champion["value"])
    return float(storage.read_json(join_uri(champion["version_uri"], "metrics.json"))[metric])


def _without_history(champion: dict | None) -> dict | None:
    # One level of history keeps the pointer small; older champions are in their manifests.
    return {k: v for k, v in champion.items() if k != "previous"} if champion else None
