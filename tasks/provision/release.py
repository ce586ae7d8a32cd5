"""Teardown step: release what provisioning and the worker controllers left behind.

Runs whatever happened upstream. Controllers normally clean up themselves; this catches
processes whose controller died (killed Airflow worker), then removes worker scratch folders.
"""
from __future__ import annotations

import shutil

from tasks import storage
from tasks.config import RunConfig, join_uri
from tasks.provision.local import kill_recorded, local_tmp_root
from tasks.runlayout import RunContext, write_manifest


def run(cfg: RunConfig, ctx: RunContext) -> str:
    killed = []
    for uri in storage.list_uris(join_uri(ctx.step_uri("provision"), "pids")):
        if not uri.endswith(".json"):
            continue
        killed += kill_recorded(storage.read_json(uri))
    tmp_root = local_tmp_root(ctx.run_uri)
    shutil.rmtree(tmp_root, ignore_errors=True)
    # Its own folder (release/), so a retry of provision never erases this record.
    return write_manifest(ctx.step_uri("release"), {
        "killed_pids": killed, "removed_tmp_root": str(tmp_root)})
