"""Teardown step: release what provisioning and the worker controllers left behind.

Runs whatever happened upstream. Controllers normally clean up themselves; the backend's
`release` catches workers whose controller died (a killed Airflow worker) and removes the
run's resources (scratch folders, Kubernetes objects, a Vertex AI job, a TPU VM).
"""
from __future__ import annotations

from tasks.config import RunConfig
from tasks.provision.backends import backend_for
from tasks.runs.runlayout import RunContext, write_manifest


def run(cfg: RunConfig, ctx: RunContext) -> str:
    released = backend_for(cfg).release(cfg, ctx)
    # Its own folder (release/), so a retry of provision never erases this record.
    return write_manifest(ctx.step_uri("release"), {"backend": cfg.provisioner, **released})
