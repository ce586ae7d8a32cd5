"""Promote step: a quality gate, then the champion pointer.

`{export_uri}/{model_name}/CHAMPION.json` names the current model:
`{"version", "version_uri", "metric", "value", "previous": {...}, "promoted_at", "dag_id",
"run_id"}`. It changes only by compare-and-swap (local: lock + rename; GCS: generation
precondition; S3: If-Match / If-None-Match), so two runs promoting at once cannot lose an
update: the loser re-reads the new champion, re-applies the gate and records it as previous.
A version that fails the gate stays published; the manifest says why it was not promoted.

With `require_approval`, the DAG asks a person between `check` (the gate's decision, written
to `gate/manifest.json`; the pointer does not move) and `run`, which is given the answer as an
`Approval`: a rejection or a timeout leaves the champion and says so in the manifest.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

from tasks.runs import runlayout
from tasks.io import storage
from tasks.config import RunConfig
from tasks.io.uris import join_uri
from tasks.errors import StorageError
from tasks.runs.runlayout import CHAMPION, RunContext
from tasks.task_kinds import kind as task_kind
from tasks.tracking import mlflow_log

ATTEMPTS = 10  # compare-and-swap rounds before giving up on a pointer that keeps moving


def champion_uri(cfg: RunConfig) -> str:
    return join_uri(cfg.resolved_export_uri(), cfg.model_name, CHAMPION)


@dataclass(frozen=True)
class Approval:
    """A person's answer to the approval task (or its timeout)."""

    approved: bool
    by: str = ""           # the user who answered; empty when nobody did
    timed_out: bool = False
    at: str = ""           # when, ISO 8601

    def reason(self, cfg: RunConfig) -> str:
        if self.timed_out:
            return (f"no approval within approval_timeout_minutes "
                    f"{cfg.approval_timeout_minutes}: counted as rejected; the champion stays")
        verb = "approved" if self.approved else "rejected"
        return f"{verb} by {self.by or 'an unnamed user'}" + (f" at {self.at}" if self.at else "")


def _candidate(cfg: RunConfig, ctx: RunContext) -> tuple[dict, str, dict]:
    """(export manifest, version URI, its metrics.json) of the run's exported version."""
    exported = runlayout.read_manifest(ctx.manifest_uri("export"))
    version_uri = exported["version_uri"]
    if not storage.is_complete(version_uri):
        raise StorageError(f"{version_uri}: not a completely published version (no "
                           f"{storage.COMPLETE}); re-run the export step")
    return exported, version_uri, storage.read_json(join_uri(version_uri, "metrics.json"))


def check(cfg: RunConfig, ctx: RunContext) -> dict:
    """The gate's decision against the current champion, without moving the pointer; also
    what the approval task shows (both sides' metrics). Written to gate/manifest.json."""
    exported, version_uri, metrics = _candidate(cfg, ctx)
    value = float(metrics[cfg.gate_metric_name])
    current = storage.read_versioned(champion_uri(cfg))
    champion = json.loads(current[0]) if current else None
    comparison = read_comparison(ctx)
    if champion and champion["version_uri"] == version_uri:
        passed, reason = True, f"{exported['version']} is already the champion"
    else:
        passed, reason = gate(cfg, value, champion, comparison)
    # What the approval task tables: the task's metrics (classification: accuracy, macro_f1),
    # both models' on the same test rows when they could be compared.
    kind = task_kind(cfg.task)
    shown = kind.gate_metrics + kind.reported_metrics
    ours, champion_metrics, champion_run = {k: metrics.get(k) for k in shown}, None, None
    if champion:
        champion_run = _run_of(champion["version_uri"])
    if _compared(comparison, champion):
        ours = comparison["metrics"]["candidate"]
        champion_metrics = comparison["metrics"]["champion"]
    result = {"passed": passed, "reason": reason, "version": exported["version"],
              "version_uri": version_uri, "model_name": cfg.model_name,
              "metric": cfg.gate_metric_name, "value": value,
              "metrics": ours, "comparison": comparison,
              "champion": without_history(champion), "champion_metrics": champion_metrics,
              "champion_run": champion_run,
              "require_approval": cfg.require_approval,
              "approval_timeout_minutes": cfg.approval_timeout_minutes,
              "dag_id": ctx.dag_id, "run_id": ctx.run_id, "run_uri": ctx.run_uri}
    runlayout.write_manifest(ctx.step_uri("gate"), result)
    return result


def _run_of(version_uri: str) -> str | None:
    """`{dag_id}/{run_key}` of the run that exported a version, from its lineage.json (None
    for a version without one): what the compare page needs to show it beside a candidate."""
    from tasks.runs import lineage

    record = lineage.read(version_uri) or {}
    if record.get("dag_id") and record.get("run_key"):
        return f"{record['dag_id']}/{record['run_key']}"
    return None


def approval_request(result: dict, run_page: str, compare_page: str = "") -> tuple[str, str]:
    """(subject, Markdown body) of the approval task, from `check`'s result: the candidate's
    metrics next to the champion's, a link to the run's page and, when the champion's run is
    known, to the two runs side by side."""
    champion = result.get("champion") or {}
    ours, theirs = result["metrics"], result.get("champion_metrics") or {}
    comparison = result.get("comparison")
    compared = _compared(comparison, champion or None)
    value = f"{result['metric']} {result['value']:.4f}"
    if compared:
        value = ", ".join(_figures(comparison))
    elif champion:
        value += f" (champion {champion['version']} not compared)"
    else:
        value += " (no champion yet)"
    subject = f"Promote {result['model_name']} {result['version']}? {value}"

    def cell(value) -> str:
        return "–" if value is None else f"{float(value):.4f}"

    rows = "\n".join(f"| {name} | {cell(ours.get(name))} | {cell(theirs.get(name))} |"
                     for name in ours)
    rows_line = (f"Both models scored on the same {comparison['units']:,} test "
                 f"{comparison['unit']} (test data sha256 `{comparison['test_sha256']}`).\n\n"
                 if compared else "")
    body = (f"The quality gate passed: {result['reason']}.\n\n{rows_line}"
            f"| metric | candidate {result['version']} | champion "
            f"{champion.get('version', '(none)')} |\n|---|---|---|\n{rows}\n\n"
            f"Gate metric: `{result['metric']}`. Run `{result['run_id']}`: "
            f"[training curves, metrics and confusion matrix]({run_page})" +
            (f"; [side by side with the champion's run]({compare_page})" if compare_page
             else "") + ".\n\n"
            f"Approve promotes the model; Reject (or no answer within "
            f"{result['approval_timeout_minutes']} minutes) keeps the champion.")
    return subject, body


def run(cfg: RunConfig, ctx: RunContext, approval: Approval | None = None) -> str:
    """Promote the exported version if the gate passes (and, when asked, a person approved)."""
    exported, version_uri, metrics = _candidate(cfg, ctx)
    value = float(metrics[cfg.gate_metric_name])
    pointer = champion_uri(cfg)
    if approval is not None and not approval.approved:
        current = storage.read_versioned(pointer)
        return runlayout.write_manifest(ctx.step_uri("promote"), {
            "promoted": False, "reason": approval.reason(cfg), "version_uri": version_uri,
            "version": exported["version"], "metric": cfg.gate_metric_name, "value": value,
            "champion_uri": pointer, "approval": asdict(approval),
            "champion_before": json.loads(current[0]) if current else None})

    comparison = read_comparison(ctx)
    for _ in range(ATTEMPTS):
        current = storage.read_versioned(pointer)
        champion = json.loads(current[0]) if current else None
        if champion and champion["version_uri"] == version_uri:  # a retry after promoting
            promoted, reason = True, f"{exported['version']} is already the champion"
            break
        promoted, reason = gate(cfg, value, champion, comparison)
        if not promoted:
            break
        if approval is not None:
            reason = f"{reason}; {approval.reason(cfg)}"
        record = {"version": exported["version"], "version_uri": version_uri,
                  "metric": cfg.gate_metric_name, "value": value,
                  "previous": without_history(champion),
                  "promoted_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "dag_id": ctx.dag_id, "run_id": ctx.run_id}
        body = (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()
        if storage.write_if_match(pointer, body, current[1] if current else None):
            break
    else:
        raise StorageError(f"{pointer}: changed {ATTEMPTS} times while promoting; retry")

    # The MLflow registry's champion alias follows the pointer; a tracker that fails only
    # warns (tasks/tracking/mlflow_log.py).
    tracked = mlflow_log.move_champion(cfg, ctx, version_uri) if promoted else None
    return runlayout.write_manifest(ctx.step_uri("promote"), {
        "promoted": promoted, "reason": reason, "version_uri": version_uri,
        "version": exported["version"], "metric": cfg.gate_metric_name, "value": value,
        "champion_uri": pointer, "champion_before": champion,
        **({"approval": asdict(approval)} if approval is not None else {}),
        **({"mlflow": tracked} if tracked else {})})


def read_comparison(ctx: RunContext) -> dict | None:
    """The gate_eval step's manifest (tasks/steps/gate_eval.py), None if it did not run."""
    uri = ctx.manifest_uri("gate_eval")
    return runlayout.read_manifest(uri) if storage.exists(uri) else None


def _compared_with(comparison: dict | None, champion: dict | None) -> bool:
    """Whether gate_eval's `comparison` looked at `champion` (compared or not)."""
    seen = (comparison or {}).get("champion") or {}
    return bool(champion) and seen.get("version_uri") == champion["version_uri"]


def _compared(comparison: dict | None, champion: dict | None) -> bool:
    """Whether `comparison` scored both models and its champion is `champion`."""
    return _compared_with(comparison, champion) and bool(comparison.get("comparable"))


def _figures(comparison: dict) -> tuple[str, str]:
    """('f1 0.9120 vs champion v2 0.9050', '+0.0070 [-0.0020, +0.0160]')"""
    d = comparison["difference"]
    return (f"{d['metric']} {d['candidate']:.4f} vs champion "
            f"{comparison['champion']['version']} {d['champion']:.4f}",
            f"{d['difference']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]")


def describe(comparison: dict) -> str:
    """'f1 0.9120 vs champion v2 0.9050 on the same 2,000 rows: +0.0070 [-0.0020, +0.0160]
    (95% paired bootstrap)'"""
    figures, interval = _figures(comparison)
    return (f"{figures} on the same {comparison['units']:,} {comparison['unit']}: {interval} "
            f"({comparison['difference']['confidence']:.0%} paired bootstrap)")


def gate(cfg: RunConfig, value: float, champion: dict | None,
         comparison: dict | None) -> tuple[bool, str]:
    """(promote?, why) for a candidate scoring `value` on cfg.gate_metric_name in its own
    evaluation, given the gate_eval step's `comparison` with the champion (docs/experiments.md,
    The quality gate).

    Both models were scored on the same test rows: promote when the lower end of the paired
    bootstrap's 95% interval of (candidate - champion) is at least -gate_max_regression.
    No champion, or one that cannot be compared (another task, other labels): the first-model
    rule, gate_min_value alone."""
    metric = cfg.gate_metric_name
    if value < cfg.gate_min_value:
        return False, f"{metric} {value:.4f} is below gate_min_value {cfg.gate_min_value}"
    if champion is None:
        return True, f"{metric} {value:.4f}; no champion yet"
    if not _compared_with(comparison, champion):
        seen = (comparison or {}).get("champion")
        compared = (f"compared with {seen['version']}" if seen else
                    "found no champion" if comparison else "did not run")
        return False, (f"the champion is {champion['version']}, but gate_eval {compared}; "
                       f"run the gate_eval step again, then the gate")
    if not comparison["comparable"]:
        return True, (f"{metric} {value:.4f}; champion {champion['version']} is not "
                      f"comparable ({comparison['reason']}): judged by the first-model rule")
    if comparison["metric"] != metric:
        return False, (f"gate_eval compared {comparison['metric']}, the gate reads {metric}; "
                       f"run gate_eval again")
    low = comparison["difference"]["low"]
    if low < -cfg.gate_max_regression:
        return False, (f"{describe(comparison)}: the interval's lower end is below "
                       f"-gate_max_regression ({-cfg.gate_max_regression:g})")
    if cfg.gate_per_class_max_regression is not None:
        slipped = class_regressions(comparison, cfg.gate_per_class_max_regression,
                                    cfg.gate_per_class_min_support)
        if slipped:
            return False, (f"{describe(comparison)}, but F1 fell by more than "
                           f"gate_per_class_max_regression ({cfg.gate_per_class_max_regression:g}) "
                           f"on {len(slipped)} class(es): {'; '.join(slipped[:3])}")
    return True, describe(comparison)


def class_regressions(comparison: dict, tolerance: float, min_support: int) -> list[str]:
    """The classes (labels, entity types) with at least `min_support` test units whose F1
    the candidate lowers by more than `tolerance` against the champion on the same rows,
    worst first, each as "name 0.8100 vs 0.9000 (-0.0900, 40 rows)"."""
    ours = comparison.get("per_class", {}).get("candidate") or {}
    theirs = comparison.get("per_class", {}).get("champion") or {}
    unit = comparison.get("unit", "rows")
    found = []
    for name, mine in ours.items():
        other = theirs.get(name)
        if other is None or mine["support"] < min_support:
            continue
        drop = other["f1"] - mine["f1"]
        if drop > tolerance:
            found.append((drop, f"{name} {mine['f1']:.4f} vs {other['f1']:.4f} "
                                f"({-drop:+.4f}, {mine['support']} {unit})"))
    return [text for _, text in sorted(found, key=lambda item: -item[0])]


def without_history(champion: dict | None) -> dict | None:
    # One level of history keeps the pointer small; older champions are in their manifests.
    return {k: v for k, v in champion.items() if k != "previous"} if champion else None
