"""Read-only summaries of run folders and model versions, for the bertflow page (plugins/).

Pure Python over `tasks.io.storage` (local, gs://, s3://), no TensorFlow. Everything is read
from fixed names inside a run or version folder found by listing the artifact root or an
export location; URIs recorded inside manifests are never followed, and names coming from a
request are checked with `valid_name` and against the listing before they become part of a
URI.

Export locations: models go to `{export_uri}/{model_name}/{version}/`, where `export_uri`
(RunConfig.resolved_export_uri, possibly templated per run) defaults to `{root}/models`. The
known locations are that default plus every distinct resolved `export_uri` the runs under
the root recorded in their config.json. A request names a location only by its
`location_id` (a hash of the URI), looked up in that server-side set; never by a path.
"""
from __future__ import annotations

import hashlib
import os
import re
from typing import Any

from tasks.io import storage
from tasks.io.uris import join_uri
from tasks.errors import StorageError
from tasks.runs.runlayout import CHAMPION

LOCATION_ID = re.compile(r"[0-9a-f]{16}")  # location_id(): what a request may name
# dag ids, run keys (runlayout.run_key_for keeps [A-Za-z0-9._-]), model names and versions.
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,249}")
HISTORY = "history.json"    # train/history.json, written by tasks.steps.train.Progress
# Worker log files, {run}/{step}/logs/{role}-{index}.log (tasks/provision/worker_logs.py).
LOG_STEPS = ("data", "tokenize", "train", "evaluate", "export")
LOG_NAME = re.compile(r"(chief|worker|ps|evaluator)-\d{1,5}\.log")


def valid_name(name: str) -> bool:
    """One path segment of a safe shape: no separators, no dot-only or '..' parts."""
    return bool(NAME.fullmatch(name)) and ".." not in name


def read_json_or_none(uri: str) -> Any:
    try:
        return storage.read_json(uri)
    except (StorageError, ValueError):
        return None


def _dict(uri: str) -> dict[str, Any]:
    """A JSON object file's content; {} when it is missing, unreadable or not an object."""
    value = read_json_or_none(uri)
    return value if isinstance(value, dict) else {}


def _folders_with(prefix: str, name: str, depth: int) -> list[tuple[str, ...]]:
    """The `depth` path parts under `prefix` of every folder holding a file `name`."""
    base = prefix.rstrip("/") + "/"
    out = set()
    for uri in storage.list_uris(prefix):
        if uri.startswith(base) and uri.endswith("/" + name):
            parts = tuple(uri[len(base):].split("/")[:-1])
            if len(parts) == depth and all(valid_name(p) for p in parts):
                out.add(parts)
    return sorted(out)


def runs_uri(root: str) -> str:
    return join_uri(root, "runs")


def models_uri(root: str) -> str:
    return join_uri(root, "models")


def list_runs(root: str) -> list[tuple[str, str]]:
    """(dag_id, run_key) of every run folder (one with a context.json) under `root`."""
    return _folders_with(runs_uri(root), "context.json", 2)


def list_versions(root: str) -> list[tuple[str, str]]:
    """(model_name, version) of every completely published version under {root}/models."""
    return list_versions_at(models_uri(root))


def list_versions_at(location: str) -> list[tuple[str, str]]:
    """(model_name, version) of every completely published version under an export
    location (`{location}/{model_name}/{version}/_COMPLETE.json`)."""
    return _folders_with(location, storage.COMPLETE, 2)


# --- export locations ------------------------------------------------------------------------

def location_id(location: str) -> str:
    """The name a page link gives an export location: a hash of its URI, never the URI."""
    return hashlib.sha256(location.encode()).hexdigest()[:16]


def normalized_location(uri: Any) -> str | None:
    """An export URI as a location (no trailing slash; local paths absolute and normalised,
    without file://); None for what cannot be one: not a string, an unsupported or
    credential-bearing URI, a relative local path (relative to which process's folder?), the
    filesystem root or a URI without a bucket."""
    if not isinstance(uri, str) or not uri.strip():
        return None
    try:
        scheme = storage.scheme_of(uri)
    except StorageError:
        return None
    if scheme == "file":
        path = str(storage.local_path(uri))
        if not os.path.isabs(path):
            return None
        return os.path.normpath(path).rstrip("/") or None
    location = uri.rstrip("/")
    return location if location.split("://", 1)[1].split("/", 1)[0] else None


def default_location(root: str) -> str:
    """{root}/models: where a run without export_uri exports."""
    return normalized_location(models_uri(root)) or models_uri(root)


def run_export_location(root: str, config: dict[str, Any]) -> str | None:
    """The resolved export URI a run recorded in its config.json
    (RunConfig.resolved_export_uri; the page's root stands for the run's artifact root, as
    the run folder was found under it); None when the recorded value is unusable."""
    recorded = config.get("export_uri")
    if recorded in (None, ""):
        return default_location(root)
    return normalized_location(recorded)


def export_locations(root: str, rows: list[dict[str, Any]] | None = None) -> list[str]:
    """The default location first, then the other distinct export locations the runs under
    `root` recorded, sorted. `rows`: run summaries already read (else config.json of every
    run is read)."""
    if rows is None:
        found = {run_export_location(root, _dict(join_uri(runs_uri(root), d, k, "config.json")))
                 for d, k in list_runs(root)}
    else:
        found = {r["export_location"] for r in rows}
    default = default_location(root)
    return [default] + sorted(loc for loc in found if loc and loc != default)


def locations_by_id(root: str) -> dict[str, str]:
    """location_id -> location for every known export location."""
    return {location_id(loc): loc for loc in export_locations(root)}


def run_summary(root: str, dag_id: str, run_key: str) -> dict[str, Any]:
    """One row of the experiments table: context, key config, training and evaluation
    figures of a run folder (None for what a step has not written yet)."""
    run = join_uri(runs_uri(root), dag_id, run_key)
    context = _dict(join_uri(run, "context.json"))
    config = _dict(join_uri(run, "config.json"))
    train = _dict(join_uri(run, "train", "manifest.json"))
    evaluation = _dict(join_uri(run, "evaluate", "manifest.json"))
    export = _dict(join_uri(run, "export", "manifest.json"))
    promote = _dict(join_uri(run, "promote", "manifest.json"))
    metrics = evaluation.get("metrics") or {}
    location = run_export_location(root, config)
    measured = train_goodput(run)
    return {
        "dag_id": dag_id, "run_key": run_key, "uri": run,
        "experiment": context.get("experiment") or config.get("experiment") or "default",
        "logical_date": context.get("logical_date") or "",
        "run_id": context.get("run_id") or "",
        "date": context.get("logical_date") or context.get("run_id") or run_key,
        "learning_rate": config.get("learning_rate"),
        "epochs": config.get("epochs"),
        "per_replica_batch_size": config.get("per_replica_batch_size"),
        "global_batch_size": train.get("global_batch_size"),
        "max_seq_length": config.get("max_seq_length"),
        "strategy": train.get("strategy") or config.get("strategy"),
        "provisioner": config.get("provisioner"),
        "accuracy": metrics.get("accuracy"),
        "macro_f1": metrics.get("macro_f1"),
        "train_seconds": train.get("train_seconds"),
        "examples_per_second": train.get("examples_per_second"),
        "steps": train.get("steps"),
        "goodput": measured["goodput"] if measured else None,
        "model_name": export.get("model_name"),
        "version": export.get("version"),
        "export_location": location,
        "export_location_id": location_id(location) if location else None,
        "promoted": promote.get("promoted"),
        "promote_reason": promote.get("reason"),
    }


def experiments(root: str) -> dict[str, list[dict[str, Any]]]:
    """Run summaries grouped by experiment (sorted by name), newest date first in a group."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for dag_id, run_key in list_runs(root):
        row = run_summary(root, dag_id, run_key)
        groups.setdefault(row["experiment"], []).append(row)
    for rows in groups.values():
        rows.sort(key=lambda r: str(r["date"]), reverse=True)
    return dict(sorted(groups.items()))


def worker_logs(root: str, dag_id: str, run_key: str) -> list[tuple[str, str]]:
    """(step, file name) of every worker log the run kept, in pipeline order."""
    run = join_uri(runs_uri(root), dag_id, run_key)
    found = []
    for step in LOG_STEPS:
        base = join_uri(run, step, "logs") + "/"
        names = [uri[len(base):] for uri in storage.list_uris(base) if uri.startswith(base)]
        found += [(step, n) for n in sorted(names) if LOG_NAME.fullmatch(n)]
    return found


def worker_log_uri(root: str, dag_id: str, run_key: str, step: str, name: str) -> str | None:
    """The URI of a log `worker_logs` lists; None for anything else."""
    if (step, name) not in worker_logs(root, dag_id, run_key):
        return None
    return join_uri(runs_uri(root), dag_id, run_key, step, "logs", name)


def train_goodput(run: str) -> dict[str, Any] | None:
    """The train step's goodput breakdown (tasks.runs.goodput); None when not measured or
    unreadable (the summary must not fail on one run's odd files)."""
    from tasks.runs import goodput
    try:
        return goodput.read_goodput(join_uri(run, "train"))
    except (ValueError, KeyError, TypeError, OSError):
        return None


def run_detail(root: str, dag_id: str, run_key: str) -> dict[str, Any]:
    """A run's summary plus what its page draws: the training history, the evaluation metrics
    (confusion matrix, per class), the train manifest and which steps have finished."""
    run = join_uri(runs_uri(root), dag_id, run_key)
    detail = run_summary(root, dag_id, run_key)
    history = _dict(join_uri(run, "train", HISTORY))
    detail.update({
        "train": _dict(join_uri(run, "train", "manifest.json")),
        "history": [r for r in history.get("records") or [] if isinstance(r, dict)],
        "history_meta": {k: v for k, v in history.items() if k != "records"},
        "metrics": _dict(join_uri(run, "evaluate", "metrics.json")) or None,
        "goodput_detail": train_goodput(run),
        "steps_done": [s for s in ("data", "tokenize", "provision", "train", "evaluate",
                                   "release", "export", "promote")
                       if storage.exists(join_uri(run, s, "manifest.json"))],
        "logs": worker_logs(root, dag_id, run_key),
        "sweep": sweep_trials(root, dag_id, run_key),
    })
    return detail


def sweep_trials(root: str, dag_id: str, run_key: str) -> list[dict[str, Any]] | None:
    """A sweep folder's trials (label, run_key, metrics, whether it is the chosen one) from
    its sweep.json and best/manifest.json; None for a folder that is not a sweep."""
    run = join_uri(runs_uri(root), dag_id, run_key)
    record = read_json_or_none(join_uri(run, "sweep.json"))
    if not isinstance(record, dict):
        return None
    best = (_dict(join_uri(run, "best", "manifest.json")).get("best") or {}).get("run_key")
    rows = []
    for trial in record.get("trials") or []:
        key = str(trial.get("run_key", ""))
        if not valid_name(key):
            continue
        evaluation = _dict(join_uri(runs_uri(root), dag_id, key, "evaluate", "manifest.json"))
        metrics = evaluation.get("metrics") or {}
        rows.append({"run_key": key, "label": str(trial.get("label", "")),
                     "accuracy": metrics.get("accuracy"), "macro_f1": metrics.get("macro_f1"),
                     "best": key == best})
    return rows


def models(root: str, locations: list[str] | None = None) -> list[dict[str, Any]]:
    """Per export location (the default first) and model name: its complete versions (newest
    first) with their metrics, and the champion pointer
    (`{location}/{model_name}/CHAMPION.json`, tasks.steps.promote)."""
    default = default_location(root)
    out = []
    for location in locations if locations is not None else export_locations(root):
        by_name: dict[str, list[str]] = {}
        for name, version in list_versions_at(location):
            by_name.setdefault(name, []).append(version)
        for name, versions in sorted(by_name.items()):
            champion = _dict(join_uri(location, name, CHAMPION)) or None
            rows = []
            for version in sorted(versions, reverse=True):
                metrics = _dict(join_uri(location, name, version, "metrics.json"))
                rows.append({"version": version, "uri": join_uri(location, name, version),
                             "accuracy": metrics.get("accuracy"),
                             "macro_f1": metrics.get("macro_f1"),
                             "champion": bool(champion) and champion.get("version") == version})
            out.append({"model": name, "champion": champion, "versions": rows,
                        "location": location, "location_id": location_id(location),
                        "default_location": location == default})
    return out
