"""Read-only summaries of run folders and model versions, for the bertflow page (plugins/).

Pure Python over `tasks.storage` (local, gs://, s3://), no TensorFlow. Everything is read
from fixed names inside a run or version folder found by listing the artifact root; URIs
recorded inside manifests are never followed, and names coming from a request are checked
with `valid_name` and against the listing before they become part of a URI.
"""
from __future__ import annotations

import re
from typing import Any

from tasks import storage
from tasks.config import join_uri
from tasks.errors import StorageError

# dag ids, run keys (runlayout.run_key_for keeps [A-Za-z0-9._-]), model names and versions.
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,249}")
CHAMPION = "CHAMPION.json"  # tasks.promote.CHAMPION (not imported: promote pulls in more)
HISTORY = "history.json"    # train/history.json, written by tasks.train.Progress


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
    return _folders_with(models_uri(root), storage.COMPLETE, 2)


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
        "model_name": export.get("model_name"),
        "version": export.get("version"),
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
        "steps_done": [s for s in ("data", "tokenize", "provision", "train", "evaluate",
                                   "release", "export", "promote")
                       if storage.exists(join_uri(run, s, "manifest.json"))],
    })
    return detail


def models(root: str) -> list[dict[str, Any]]:
    """Per model name: its complete versions (newest first) with their metrics, and the
    champion pointer."""
    by_name: dict[str, list[str]] = {}
    for name, version in list_versions(root):
        by_name.setdefault(name, []).append(version)
    out = []
    for name, versions in sorted(by_name.items()):
        champion = _dict(join_uri(models_uri(root), name, CHAMPION)) or None
        rows = []
        for version in sorted(versions, reverse=True):
            metrics = _dict(join_uri(models_uri(root), name, version, "metrics.json"))
            rows.append({"version": version, "uri": join_uri(models_uri(root), name, version),
                         "accuracy": metrics.get("accuracy"), "macro_f1": metrics.get("macro_f1"),
                         "champion": bool(champion) and champion.get("version") == version})
        out.append({"model": name, "champion": champion, "versions": rows})
    return out
