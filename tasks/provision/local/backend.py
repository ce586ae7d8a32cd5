"""The embedded default backend: workers are processes on the Airflow worker's machine
(`LocalCluster`, loopback ports), so `make demo` needs no cloud at all."""
from __future__ import annotations

import shutil

from tasks.io import storage
from tasks.config import RunConfig
from tasks.io.uris import join_uri
from tasks.provision.backends import Backend, Log
from tasks.provision.local.cluster import LocalCluster, kill_recorded, local_tmp_root
from tasks.provision.spec import WorkerSpec
from tasks.provision.worker_logs import StepLogs, attempt_of
from tasks.runs.runlayout import RunContext


def pid_record_uri(run_uri: str, step: str) -> str:
    """Where the controller of `step` records its worker pids (one file per step, so a retry
    of one step rewrites only its own record)."""
    return join_uri(run_uri, "provision", "pids", f"{step}.json")


class LocalBackend(Backend):
    name = "local"

    def render(self, cfg: RunConfig, ctx: RunContext, spec: WorkerSpec) -> list[dict]:
        # Addresses are picked at start (free loopback ports), so the dry run shows the roles.
        return [{"process": f"{role}:{index}", "command": spec.command, "env": spec.env,
                 "tf_config_role": {"type": role, "index": index} if spec.cluster else None}
                for role, index in spec.roles]

    def controller(self, cfg: RunConfig, ctx: RunContext, spec: WorkerSpec, *, log: Log,
                   secrets: dict[str, str]) -> LocalCluster:
        record_uri = pid_record_uri(ctx.run_uri, spec.step)
        if storage.exists(record_uri):  # a retry: whatever a dead earlier attempt left running
            kill_recorded(storage.read_json(record_uri))
        # Secrets reach the processes' environment at start only, never the spec.
        return LocalCluster(spec, log=log, record_uri=record_uri,
                            tmp_root=local_tmp_root(ctx.run_uri), extra_env=secrets,
                            logs=StepLogs(ctx.run_uri, spec.step, log,
                                          attempt=attempt_of(spec.env)))

    def release(self, cfg: RunConfig, ctx: RunContext, log: Log = print) -> dict:
        """Kill processes whose controller died (a killed Airflow worker), then remove the
        workers' scratch folders."""
        killed = []
        for uri in storage.list_uris(join_uri(ctx.step_uri("provision"), "pids")):
            if uri.endswith(".json"):
                killed += kill_recorded(storage.read_json(uri))
        tmp_root = local_tmp_root(ctx.run_uri)
        shutil.rmtree(tmp_root, ignore_errors=True)
        return {"killed_pids": killed, "removed_tmp_root": str(tmp_root)}
