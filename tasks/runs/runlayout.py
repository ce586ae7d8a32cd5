"""Where a run's artifacts live, and the small JSON manifests steps hand to each other.

Layout under the artifact root:
    {root}/runs/{dag_id}/{run_key}/{step}/...   one folder per step; a retry rewrites only it
    {root}/cache/tfrecords/{content_hash}/      tokenized data, shared by runs and backfills
Every step writes `manifest.json` in its folder and returns that URI (XCom carries URIs only).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from tasks.io import storage
from tasks.config import RunConfig, load_config
from tasks.io.uris import join_uri

MANIFEST = "manifest.json"
CONFIG = "config.json"
CONTEXT = "context.json"
# The model store, {export_uri}/{model_name}/: a folder per exported version and this pointer
# to the current one, written by tasks.steps.promote and read by tasks.training.
# checkpoint_sources (base_model "champion") and tasks.runs.run_summary (the plugin's pages).
CHAMPION = "CHAMPION.json"


def run_key_for(run_type: str, logical_date_iso: str | None, run_id: str,
                experiment: str = "default") -> str:
    """Scheduled and backfill runs are keyed by experiment and logical date (a re-run of a
    date of an experiment lands in the same folder; another experiment never does); manual
    runs by their run id, which is unique."""
    if run_type in ("scheduled", "backfill") and logical_date_iso:
        key = f"{experiment}__{logical_date_iso}"
    else:
        key = run_id
    return re.sub(r"[^A-Za-z0-9._-]+", "_", key)


@dataclass(frozen=True)
class RunContext:
    artifact_root: str
    dag_id: str
    run_key: str
    run_id: str = ""
    experiment: str = "default"
    logical_date: str = ""  # ISO 8601; empty for a run without one
    # Set when the run folder is not {artifact_root}/runs/{dag_id}/{run_key} (a folder given
    # to `python -m tasks init-run`); the tokenized-data cache stays under artifact_root.
    run_dir: str = ""

    @property
    def run_uri(self) -> str:
        return self.run_dir or join_uri(self.artifact_root, "runs", self.dag_id, self.run_key)

    def step_uri(self, step: str) -> str:
        return join_uri(self.run_uri, step)

    def manifest_uri(self, step: str) -> str:
        return join_uri(self.step_uri(step), MANIFEST)

    @property
    def config_uri(self) -> str:
        return join_uri(self.run_uri, CONFIG)

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def cache_uri(artifact_root: str, content_hash: str) -> str:
    return join_uri(artifact_root, "cache", "tfrecords", content_hash)


def write_manifest(step_uri: str, manifest: dict[str, Any]) -> str:
    uri = join_uri(step_uri, MANIFEST)
    storage.write_json(uri, manifest)
    return uri


def read_manifest(uri: str) -> dict[str, Any]:
    return storage.read_json(uri)


def write_run_config(ctx: RunContext, cfg: RunConfig) -> str:
    storage.write_text(ctx.config_uri, cfg.to_json())
    return ctx.config_uri


def read_run_config(uri: str) -> RunConfig:
    return load_config(storage.read_text(uri))


def init_run(cfg: RunConfig, ctx: RunContext) -> str:
    """Write a run folder's config.json and context.json; returns the run URI."""
    write_run_config(ctx, cfg)
    storage.write_json(join_uri(ctx.run_uri, CONTEXT), ctx.to_dict())
    return ctx.run_uri


def load_run(run_uri: str) -> tuple[RunConfig, RunContext]:
    """Config and context of a run folder; also points storage at the run's connections."""
    ctx = RunContext(**storage.read_json(join_uri(run_uri, CONTEXT)))
    cfg = read_run_config(ctx.config_uri)
    storage.configure(storage.Connections(cfg.gcp_conn_id, cfg.aws_conn_id))
    return cfg, ctx
