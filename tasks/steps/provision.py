"""Provision step: the setup of the worker steps (`release` is its teardown).

`run(cfg, ctx)` resolves the strategy and cluster shape, checks the config against the chosen
backend (`provisioner`), checks permissions on a non-local run (tasks/provision/preflight.py),
creates what the backend makes at setup (a TPU VM), and writes the
worker specs of every worker step to `provision/manifest.json`. Controllers run those specs
with `backend_for(cfg).controller(...)`; `dry_run` prints what the backend would create.
"""
from __future__ import annotations

from tasks.config import RunConfig
from tasks.provision import capacity
from tasks.provision.backends import backend_for, to_text
from tasks.provision.local.cluster import local_tmp_root
from tasks.provision.spec import DISTRIBUTED_STEPS, WORKER_STEPS, distributed_spec, step_spec
from tasks.runs.runlayout import RunContext, write_manifest

def run(cfg: RunConfig, ctx: RunContext) -> str:
    backend = backend_for(cfg)
    capacity.check(cfg)
    backend.check(cfg, ctx)
    if cfg.provisioner != "local":  # permissions, before anything costs money
        from tasks.provision import preflight

        preflight.run(cfg, ctx, backend)
    specs = {step: distributed_spec(cfg, step, ctx.run_uri) for step in DISTRIBUTED_STEPS}
    first = specs[DISTRIBUTED_STEPS[0]]
    resources = backend.setup(cfg, ctx)
    return write_manifest(ctx.step_uri("provision"), {
        "backend": cfg.provisioner,
        "strategy": first.strategy,
        "cluster": first.cluster,
        "num_processes": len(first.roles),
        "workers": {step: spec.to_dict() for step, spec in specs.items()},
        "resources": resources,
        "tmp_root": str(local_tmp_root(ctx.run_uri)),
    })


def dry_run(cfg: RunConfig, ctx: RunContext, warn=print) -> str:
    """What the configured backend would create for every worker step, as text to review
    (Kubernetes YAML for `kubectl apply -f`, JSON for Vertex AI and TPU VMs). Touches no
    cloud and writes nothing."""
    backend = backend_for(cfg)
    capacity.check(cfg)
    for message in backend.check(cfg, ctx, dry_run=True):
        warn(message)
    objects = []
    for step in WORKER_STEPS:
        objects += backend.render(cfg, ctx, step_spec(cfg, step, ctx.run_uri))
    notes = backend.dry_run_notes(cfg, ctx)
    if cfg.capacity != "on_demand":  # which steps the capacity covers (capacity_cpu_steps)
        notes = [capacity.steps_on(cfg), *notes]
    for note in notes:
        warn(note)
    header = "".join(f"# {note}\n" for note in notes) if backend.render_format == "yaml" else ""
    return header + to_text(backend, objects)
