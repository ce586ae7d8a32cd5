"""Worker backends: one WorkerSpec, many places to run it.

The `provisioner` field picks the backend; nothing outside tasks/provision/ learns which one
runs. Every backend answers the same calls:

- `check(cfg, ctx, dry_run)`: problems with the config for this backend, before any work.
  Raises ConfigError for a real run; returns warnings (a dry run from a local folder).
- `preflight_checks(cfg, ctx)`: may the run's identity do what the backend will do
  (tasks/provision/preflight.py runs them after its shared storage probes).
- `render(cfg, ctx, spec)`: the objects it would create for one step's spec (Kubernetes
  objects, a CustomJob, a queued resource) as JSON-able dicts. No cloud is touched.
- `setup(cfg, ctx)`: long-lived resources made at the provision step (a TPU VM); facts for
  the provision manifest.
- `controller(cfg, ctx, spec, log, secrets)`: an object with `run()` (blocks; starts the
  workers, streams their logs with a `[role:i]` prefix, returns when the main task succeeds,
  raises WorkerError when any fails) and `stop()` (any thread; Airflow's on_kill).
- `release(cfg, ctx)`: the teardown; removes everything of the run, whatever happened.
- `sweep(cfg, log)`: removes what runs that are no longer running left behind.

`secrets` are the run's Airflow connections as `AIRFLOW_CONN_*` values
(tasks/io/credentials.py). A backend hands them to its workers without writing them into any
spec, manifest, rendered object or log.
"""
from __future__ import annotations

import importlib
import json
import re
from typing import Callable, Protocol

from tasks.io import storage
from tasks.config import RunConfig
from tasks.errors import ConfigError
from tasks.provision.spec import WorkerSpec
from tasks.runs.runlayout import RunContext

Log = Callable[[str], None]

# provisioner -> "module:class", imported only when chosen (cloud clients are heavy).
BACKENDS = {
    "local": "tasks.provision.local.backend:LocalBackend",
    "kubernetes": "tasks.provision.kubernetes.backend:KubernetesBackend",
    "vertex_ai": "tasks.provision.vertex_ai.backend:VertexAIBackend",
    "tpu_vm": "tasks.provision.tpu_vm.backend:TpuVmBackend",
}


class Controller(Protocol):
    def run(self) -> None: ...

    def stop(self) -> None: ...


class Backend:
    """Base class; see the module docstring for the contract."""

    name = ""
    # Objects' text form for `provision --dry-run`: "yaml" (kubectl apply -f) or "json".
    render_format = "json"
    # Whether workers get the run's Airflow connections (tasks/io/credentials.py). Backends
    # whose job specs cannot hold a secret say False; validate then stages a Hub base_model
    # that needs a token in the run's bucket (tasks/training/hub_staging.py).
    receives_connections = True

    def check(self, cfg: RunConfig, ctx: RunContext, dry_run: bool = False) -> list[str]:
        return []

    def preflight_checks(self, cfg: RunConfig, ctx: RunContext) -> list:
        """This backend's preflight checks (tasks/provision/preflight.py's Check), from its
        own folder's preflight.py; the shared storage probes run for every backend."""
        return []

    def render(self, cfg: RunConfig, ctx: RunContext, spec: WorkerSpec) -> list[dict]:
        raise NotImplementedError

    def dry_run_notes(self, cfg: RunConfig, ctx: RunContext) -> list[str]:
        """What a user must do before applying the dry run's objects (e.g. create a Secret)."""
        return []

    def setup(self, cfg: RunConfig, ctx: RunContext, log: Log = print) -> dict:
        return {}

    def controller(self, cfg: RunConfig, ctx: RunContext, spec: WorkerSpec, *, log: Log,
                   secrets: dict[str, str]) -> Controller:
        raise NotImplementedError

    def release(self, cfg: RunConfig, ctx: RunContext, log: Log = print) -> dict:
        return {}

    def sweep(self, cfg: RunConfig, log: Log = print) -> list[str]:
        return []


def backend_for(cfg: RunConfig) -> Backend:
    module, _, cls = BACKENDS[cfg.provisioner].partition(":")
    return getattr(importlib.import_module(module), cls)()


def remote_folder_problems(cfg: RunConfig) -> list[tuple[str, str]]:
    """(field, reason) for every location remote workers could not reach: they share no disk
    with the Airflow worker, so run folders, the cache and exports must be in a bucket."""
    problems = []
    for field in ("artifact_root", "export_uri"):
        value = getattr(cfg, field)
        if value and storage.is_local(value):
            problems.append((field, f"{value} is a local path, which remote workers "
                                    f"({cfg.provisioner}) cannot see; use a gs:// or s3:// "
                                    f"location"))
    return problems


def check_remote(cfg: RunConfig, dry_run: bool) -> list[str]:
    """Raise for the first local location on a real run; on a dry run, return them as
    warnings (the rendered objects are still worth reviewing)."""
    problems = remote_folder_problems(cfg)
    if problems and not dry_run:
        raise ConfigError(*problems[0])
    return [f"{field}: {reason} (a real run refuses this)" for field, reason in problems]


def google_label_value(text: str) -> str:
    """A Google Cloud label value (Vertex AI jobs, TPU VMs): lowercase letters, digits, '_'
    and '-', at most 63 characters."""
    return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:63]


def to_text(backend: Backend, objects: list[dict]) -> str:
    """Rendered objects as the dry run prints them."""
    if backend.render_format == "yaml":
        import yaml

        return yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False)
    return json.dumps(objects if len(objects) != 1 else objects[0], indent=2)
