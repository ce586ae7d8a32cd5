"""A Hugging Face Hub base_model staged in the run's bucket for workers that get no token.

Vertex AI and TPU VM workers receive no Airflow connections (their job and VM specs are
readable by anyone who may list jobs, so bertflow puts no secret there): a gated or private
Hub repo named with `hf_conn_id` would fail on them. The controller (the validate task, which
can read the connection) fetches the pinned commit once and publishes its files under the
artifact root, `checkpoints/hub/<owner>--<name>/<commit>/`; the workers read that folder with
the bucket access they already have. A file beside the weights names the Hub repo and commit,
so the train manifest, the model card and the lineage still record the Hub as the source.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from tasks.config import RunConfig

from tasks.io.uris import join_uri
from tasks.io import storage
from tasks.training import checkpoint_sources


def staged_uri(cfg: RunConfig, repo: str, commit: str) -> str:
    return join_uri(cfg.artifact_root, "checkpoints", "hub", repo.replace("/", "--"), commit)


def stage_for_workers(cfg: RunConfig) -> str:
    """base_model for workers without connections: a Hub id with hf_conn_id becomes its staged
    bucket folder (published once per commit, reused by later runs); anything else is
    returned unchanged."""
    src = checkpoint_sources.parse(cfg.base_model)
    if src.kind != "hub" or not cfg.hf_conn_id:
        return cfg.base_model
    resolved = checkpoint_sources.resolve(cfg)
    target = staged_uri(cfg, src.location, resolved.revision)
    if storage.is_complete(target):
        return target
    with tempfile.TemporaryDirectory(prefix="bertflow-stage-") as tmp:
        for name in resolved.files:
            shutil.copyfile(resolved.path / name, Path(tmp) / name)
        origin = {"kind": "hub", "source": cfg.base_model, "location": src.location,
                  "revision": resolved.revision, "files": resolved.files}
        storage.write_json(str(Path(tmp) / checkpoint_sources.STAGED_ORIGIN), origin)
        storage.publish_dir(Path(tmp), target)
    return target
