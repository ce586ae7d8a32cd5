"""Worker provisioning: the setup step of the pipeline (`release` is its teardown).

`run(cfg, ctx)` resolves the strategy and cluster shape and writes the worker specs for train
and evaluate to `provision/manifest.json`; controllers render them with a backend
(`LocalCluster` for the local backend).
"""
from __future__ import annotations

from tasks.config import RunConfig, join_uri
from tasks.provision.local import LocalCluster, kill_recorded, local_tmp_root
from tasks.provision.spec import WorkerSpec, distributed_spec, single_process_spec
from tasks.runlayout import RunContext, write_manifest

__all__ = ["LocalCluster", "WorkerSpec", "distributed_spec", "single_process_spec", "run",
           "pid_record_uri", "local_tmp_root", "kill_recorded"]

DISTRIBUTED_STEPS = ("train", "evaluate")


def pid_record_uri(run_uri: str, step: str) -> str:
    """Where the controller of `step` records its worker pids (one file per step, so a retry
    of one step rewrites only its own record)."""
    return join_uri(run_uri, "provision", "pids", f"{step}.json")


def run(cfg: RunConfig, ctx: RunContext) -> str:
    specs = {step: distributed_spec(cfg, step, ctx.run_uri) for step in DISTRIBUTED_STEPS}
    first = specs[DISTRIBUTED_STEPS[0]]
    return write_manifest(ctx.step_uri("provision"), {
        "backend": cfg.provisioner,
        "strategy": first.strategy,
        "cluster": first.cluster,
        "num_processes": len(first.roles),
        "workers": {step: spec.to_dict() for step, spec in specs.items()},
        "tmp_root": str(local_tmp_root(ctx.run_uri)),
    })
