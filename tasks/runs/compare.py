"""Runs side by side, for the bertflow page's compare view (plugins/): which config fields and
metrics differ between run folders, their training curves and confusion matrices.

Pure Python over `tasks.io.storage`, no TensorFlow or Airflow. A run is named by its run folder,
`{dag_id}/{run_key}` (a sweep's trials are run folders too); names are checked with
`run_summary.valid_name` and against the listing of the artifact root before they become part
of a URI, as the run page does.
"""
from __future__ import annotations

import math
from typing import Any

from tasks.io.uris import join_uri
from tasks.runs import run_summary

# history.json record keys that are not curves (the x axis and bookkeeping).
NOT_CURVES = ("step", "epoch", "elapsed_seconds")


class _Absent:
    """A field a run's file does not have (distinct from a recorded null)."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()


class CompareError(ValueError):
    """A request the compare view cannot answer; `status` is the HTTP status to give."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def parse_refs(values: list[str]) -> list[tuple[str, str]]:
    """`dag_id/run_key` strings as (dag_id, run_key), repeats dropped, in the order given.
    CompareError(400) for a malformed one or fewer than 2 distinct runs."""
    refs: list[tuple[str, str]] = []
    for value in values:
        parts = tuple(value.split("/"))
        if len(parts) != 2 or not all(run_summary.valid_name(p) for p in parts):
            raise CompareError(400, f"run {value!r} is not dag_id/run_key")
        if parts not in refs:
            refs.append(parts)
    if len(refs) < 2:
        raise CompareError(400, f"pick at least 2 runs to compare (got {len(refs)}): "
                                f"?run=dag_id/run_key&run=dag_id/run_key")
    return refs


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """A JSON object as dotted field -> leaf value (lists stay whole: they are one value)."""
    if not isinstance(value, dict):
        return {prefix: value} if prefix else {}
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(item, dict) and item:
            out.update(flatten(item, name))
        else:
            out[name] = item
    return out


def split_fields(per_run: list[dict[str, Any]]) -> tuple[list[tuple[str, list]], list[tuple]]:
    """(differing, equal): every field any run has, sorted by name. A differing field carries
    each run's value (ABSENT where a run lacks it); an equal one its single value. 1, 1.0 and
    True are different values here (a changed type is a change in the config file)."""
    names = sorted({name for fields in per_run for name in fields})
    differing, equal = [], []
    for name in names:
        values = [fields.get(name, ABSENT) for fields in per_run]
        if all(v == values[0] and type(v) is type(values[0]) for v in values):
            equal.append((name, values[0]))
        else:
            differing.append((name, values))
    return differing, equal


def _curves(history: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Series name -> (step, value) points of a run's train/history.json records: every
    finite numeric key but the x axis (loss, accuracy, learning_rate; eval_* when recorded)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for record in history:
        step = record.get("step")
        if not isinstance(step, int):
            continue
        for key, value in record.items():
            if key in NOT_CURVES or isinstance(value, bool) or \
                    not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            out.setdefault(key, []).append((float(step), float(value)))
    return out


def compare(root: str, refs: list[tuple[str, str]]) -> dict[str, Any]:
    """What the compare view shows for existing runs `refs` (CompareError(404) naming the
    first that is not a run folder under `root`): per run its summary, curves and evaluate
    metrics file; the config fields (config.json) and metrics (the evaluate manifest's)
    split into differing and equal; the curve names any run recorded."""
    known = set(run_summary.list_runs(root))
    for dag_id, run_key in refs:
        if (dag_id, run_key) not in known:
            raise CompareError(404, f"no such run folder: {dag_id}/{run_key}")
    runs = []
    for dag_id, run_key in refs:
        uri = join_uri(run_summary.runs_uri(root), dag_id, run_key)
        history = run_summary.read_json_or_none(join_uri(uri, "train", run_summary.HISTORY))
        records = history.get("records") if isinstance(history, dict) else None
        evaluation = run_summary.read_json_or_none(join_uri(uri, "evaluate", "manifest.json"))
        metrics_file = run_summary.read_json_or_none(join_uri(uri, "evaluate", "metrics.json"))
        runs.append({
            "ref": f"{dag_id}/{run_key}",
            "summary": run_summary.run_summary(root, dag_id, run_key),
            "config": flatten(run_summary.read_json_or_none(join_uri(uri, "config.json"))),
            "metrics": flatten((evaluation or {}).get("metrics")
                               if isinstance(evaluation, dict) else None),
            "curves": _curves([r for r in records or [] if isinstance(r, dict)]),
            "evaluation": metrics_file if isinstance(metrics_file, dict) else None,
        })
    config_diff, config_equal = split_fields([r["config"] for r in runs])
    metrics_diff, metrics_equal = split_fields([r["metrics"] for r in runs])
    first = ("loss", "accuracy", "learning_rate")  # as the run page orders them
    series = sorted({name for r in runs for name in r["curves"]},
                    key=lambda s: (first.index(s) if s in first else len(first), s))
    return {"runs": runs, "config_differing": config_diff, "config_equal": config_equal,
            "metrics_differing": metrics_diff, "metrics_equal": metrics_equal,
            "series": series}
