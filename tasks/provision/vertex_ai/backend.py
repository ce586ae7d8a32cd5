"""Vertex AI backend: one worker step = one Vertex AI CustomJob (google-cloud-aiplatform).

The job (`custom_job`), in Vertex AI's worker-pool order:

| bertflow cluster (WorkerSpec.cluster)     | pool 0 (chief) | pool 1 (workers) | pool 2 (ps) |
|-------------------------------------------|----------------|------------------|-------------|
| single process (one_device, mirrored, tpu, tokenize, export) | 1 | - | - |
| multi_worker_mirrored {"worker": n}       | 1 (worker 0)   | n - 1            | -           |
| parameter_server {chief 1, worker n, ps m}| 1              | n                | m           |

Vertex AI writes each replica's TF_CONFIG itself (pool 0 is the task type "chief", pool 1
"worker", pool 2 "ps"), and `python -m tasks` takes it as it is (tasks/provision/launcher.py).
MultiWorkerMirroredStrategy accepts a chief task: it joins the all-reduce as task 0 and is
the writer (tasks/training/strategy.is_chief). Every replica runs the spec's command in the worker
image; train/evaluate pools 0-1 get the configured accelerators, ps pools, the
parameter_server chief (a coordinator that computes nothing) and the other steps a CPU
machine. A MultiWorkerMirrored job sets `scheduling.restart_job_on_worker_restart`: a worker
Vertex AI restarts cannot rejoin the collective, so the whole job restarts (from the latest
checkpoint) instead of hanging.

Credentials and secrets: the workers run as the job's service account (`service_account`),
so the run's Airflow connections (`secrets`) are not passed to Vertex AI. When `gcp_conn_id`
is set, the workers get a keyless `AIRFLOW_CONN_<ID>` (project only), so their storage uses
ambient credentials, i.e. the job's service account. The controller's own client uses the
`gcp_conn_id` connection's key (tasks.io.cloud_storage.google_connection), else application
default credentials.

Lifecycle: the controller creates the job, records its name and console link in
`{run}/provision/vertex/{step}.json`, polls its state with backoff, cancels it when waiting
for machines longer than `schedule_timeout_seconds` or when stopped (on_kill), and fails with
Vertex AI's own error message. `release` cancels every job of the run still alive (found
through the records and the `bertflow-run` label); `sweep` cancels bertflow-labelled jobs
alive longer than `worker_timeout_minutes` (Vertex AI also enforces that timeout itself).
Worker logs go to Cloud Logging, which the controller links to instead of streaming; each
replica also keeps its own log in `{run}/{step}/logs/{role}-{index}.log`
(tasks/provision/worker_logs.py).

`BERTFLOW_VERTEX_ENDPOINT=http://HOST:PORT` points the client at an emulator or a test fake
(REST transport, anonymous credentials); never set it in production.
"""
from __future__ import annotations

import datetime as dt
import math
import threading
import time
import urllib.parse

import tenacity
from google.api_core import exceptions

from tasks.io import credentials, storage
from tasks.config import RunConfig
from tasks.io.uris import join_uri
from tasks.errors import ConfigError, WorkerError
from tasks.provision import capacity, worker_logs
from tasks.provision.images import default_image, image_kind
from tasks.provision.backends import Backend, Log, check_remote, google_label_value
from tasks.provision.preflight import api_message
from tasks.provision.spec import WorkerSpec, run_hash
from tasks.provision.vertex_ai.client import job_client, parent, resolve_project
from tasks.runs.runlayout import RunContext

# Poll intervals (s): start short, grow by POLL_GROWTH per unchanged state, up to the max.
POLL_MIN_SECONDS = 5.0
POLL_MAX_SECONDS = 60.0
POLL_GROWTH = 1.5
# Consecutive transient errors of get_custom_job tolerated before the step fails.
MAX_POLL_ERRORS = 5
# Answers of the API worth asking again (google-api-core's exception classes): 503, 504, 500,
# 429.
TRANSIENT = (exceptions.ServiceUnavailable, exceptions.DeadlineExceeded,
             exceptions.InternalServerError, exceptions.TooManyRequests)

POOL_ROLES = ("chief", "worker", "ps")
MANAGED_BY = "bertflow"
RUN_LABEL, DAG_LABEL, STEP_LABEL = "bertflow-run", "bertflow-dag", "bertflow-step"

WAITING = {"JOB_STATE_QUEUED", "JOB_STATE_PENDING"}
ALIVE = WAITING | {"JOB_STATE_RUNNING", "JOB_STATE_UPDATING", "JOB_STATE_PAUSED"}
# Terminal: JOB_STATE_SUCCEEDED, _FAILED, _CANCELLED, _EXPIRED, _PARTIALLY_SUCCEEDED;
# JOB_STATE_CANCELLING is on its way there (no second cancel needed).

CPU_MACHINE = "n1-standard-8"
# Default machine for `count` GPUs of a type (Vertex AI "Configure compute resources for
# custom training"); other counts or types need machine_type.
GPU_MACHINES: dict[str, dict[int, str]] = {
    "NVIDIA_L4": {1: "g2-standard-8", 2: "g2-standard-24", 4: "g2-standard-48",
                  8: "g2-standard-96"},
    "NVIDIA_TESLA_T4": {n: CPU_MACHINE for n in (1, 2, 4)},
    "NVIDIA_TESLA_V100": {n: CPU_MACHINE for n in (1, 2, 4, 8)},
    "NVIDIA_TESLA_P100": {n: CPU_MACHINE for n in (1, 2, 4)},
    "NVIDIA_TESLA_P4": {n: CPU_MACHINE for n in (1, 2, 4)},
    "NVIDIA_TESLA_A100": {**{n: f"a2-highgpu-{n}g" for n in (1, 2, 4, 8)},
                          16: "a2-megagpu-16g"},
    "NVIDIA_A100_80GB": {n: f"a2-ultragpu-{n}g" for n in (1, 2, 4, 8)},
    "NVIDIA_H100_80GB": {n: f"a3-highgpu-{n}g" for n in (1, 2, 4, 8)},
    "NVIDIA_H100_MEGA_80GB": {8: "a3-megagpu-8g"},
    "NVIDIA_H200_141GB": {8: "a3-ultragpu-8g"},
    "NVIDIA_B200": {8: "a4-highgpu-8g"},
}
# TPU type -> (default chips, {chips: (machine type, topology)}): single-host slices only,
# since bertflow's tpu strategy runs one process (multi-host slices: provisioner tpu_vm).
# Only the TPUs Vertex AI trains TensorFlow on: "Training with TPU accelerators"
# (cloud.google.com/vertex-ai/docs/training/training-with-tpu-vm, read 2026-12-04) lists TPU
# v2, v3 and v5e VMs, and says TensorFlow is not supported from v6e on; the client's
# TPU_V4_POD is not among them.
VERTEX_TPU_DOCS = "cloud.google.com/vertex-ai/docs/training/training-with-tpu-vm"
TPU_MACHINES: dict[str, tuple[int, dict[int, tuple[str, str]]]] = {
    "TPU_V2": (8, {8: ("cloud-tpu", "")}),
    "TPU_V3": (8, {8: ("cloud-tpu", "")}),
    "TPU_V5_LITEPOD": (4, {1: ("ct5lp-hightpu-1t", "1x1"), 4: ("ct5lp-hightpu-4t", "2x2"),
                           8: ("ct5lp-hightpu-8t", "2x4")}),
}


# --- the job ----------------------------------------------------------------------------------
def accelerator_types() -> list[str]:
    """Accelerator names the installed client knows (AcceleratorType, minus UNSPECIFIED)."""
    from google.cloud.aiplatform_v1.types import AcceleratorType

    return [t.name for t in AcceleratorType if t.value != 0]


def checked_accelerator(cfg: RunConfig) -> str:
    """cfg.accelerator_type, validated against the client's enum and `accelerator`; "" = CPU."""
    kind = cfg.accelerator_type
    if not kind:
        if cfg.accelerator in ("gpu", "tpu"):
            example = "NVIDIA_L4" if cfg.accelerator == "gpu" else "TPU_V5_LITEPOD"
            raise ConfigError("accelerator_type", f"accelerator {cfg.accelerator} on vertex_ai "
                                                  f"needs an accelerator type, e.g. {example}")
        return ""
    valid = accelerator_types()
    if kind not in valid:
        raise ConfigError("accelerator_type", f"{kind!r} is not a Vertex AI accelerator type; "
                                              f"expected one of {', '.join(valid)}")
    is_tpu = kind.startswith("TPU_")
    if is_tpu and kind not in TPU_MACHINES:
        raise ConfigError("accelerator_type", (
            f"Vertex AI does not train TensorFlow on {kind}: its TPU page lists "
            f"{', '.join(TPU_MACHINES)} (v2, v3, v5e; {VERTEX_TPU_DOCS}). Use one of those, "
            f"or provisioner tpu_vm (a Cloud TPU VM) for other TPU generations"))
    if cfg.accelerator == "cpu":
        raise ConfigError("accelerator_type", f"{kind} is set but accelerator is cpu; clear "
                                              "it, or set accelerator to auto")
    if cfg.accelerator == "gpu" and is_tpu or cfg.accelerator == "tpu" and not is_tpu:
        raise ConfigError("accelerator_type", f"{kind} does not match accelerator "
                                              f"{cfg.accelerator}")
    return kind


def _chips(topology: str) -> int:
    return math.prod(int(d) for d in topology.split("x"))


def machine_spec(cfg: RunConfig, accelerated: bool) -> dict:
    """MachineSpec (dict) of an accelerated pool (train/evaluate chief and workers) or a CPU
    one (ps, tokenize, export)."""
    kind = checked_accelerator(cfg)
    if not accelerated or not kind:
        # An explicit machine_type is for the accelerated pools when there are accelerators.
        return {"machine_type": cfg.machine_type if cfg.machine_type and not kind
                else CPU_MACHINE}
    if kind in TPU_MACHINES:
        default_chips, machines = TPU_MACHINES[kind]
        chips = cfg.devices_per_worker or (_chips(cfg.tpu_topology) if cfg.tpu_topology
                                           else default_chips)
        machine, topology = machines.get(chips, ("", ""))
        topology = cfg.tpu_topology or topology
        if not cfg.machine_type and not machine:
            raise ConfigError("machine_type" if chips in (1, 2, 4, 8) else "tpu_topology",
                              f"no single-host {kind} machine with {chips} chips (known: "
                              f"{', '.join(str(c) for c in machines)}); set machine_type, or "
                              "use provisioner tpu_vm for multi-host slices")
        spec = {"machine_type": cfg.machine_type or machine, "accelerator_type": kind,
                "accelerator_count": chips}
        if topology:
            spec["tpu_topology"] = topology
        return spec
    count = cfg.devices_per_worker or 1
    machine = cfg.machine_type or GPU_MACHINES.get(kind, {}).get(count)
    if not machine:
        raise ConfigError("machine_type", f"no default machine type for {count} x {kind}; set "
                                          "machine_type (see Vertex AI's GPU table for custom "
                                          "training)")
    return {"machine_type": machine, "accelerator_type": kind, "accelerator_count": count}


def pool_replicas(spec: WorkerSpec) -> list[int]:
    """Replicas of pools 0 (chief), 1 (workers), 2 (ps); trailing empty pools dropped."""
    cluster = spec.cluster
    if not cluster:
        return [1]
    if cluster.get("chief"):
        counts = [cluster["chief"], cluster.get("worker", 0), cluster.get("ps", 0)]
    else:  # MWMS: worker 0 becomes Vertex AI's chief (pool 0 has exactly one replica)
        counts = [1, cluster.get("worker", 0) - 1, cluster.get("ps", 0)]
    while counts and counts[-1] == 0:
        counts.pop()
    return counts


def pool_computes(spec: WorkerSpec, role: str) -> bool:
    """ps tasks and the parameter_server chief (it only coordinates) need no accelerator."""
    return not (role == "ps" or (role == "chief" and spec.strategy == "parameter_server"))


def run_label(ctx: RunContext) -> str:
    return run_hash(ctx.run_uri, 16)


def labels(ctx: RunContext, step: str) -> dict[str, str]:
    return {"managed-by": MANAGED_BY, RUN_LABEL: run_label(ctx),
            DAG_LABEL: google_label_value(ctx.dag_id),
            STEP_LABEL: google_label_value(step or "worker")}


def worker_image(cfg: RunConfig) -> str:
    return cfg.worker_image or default_image(image_kind(cfg.accelerator, cfg.accelerator_type),
                                             cfg.image_registry)


def worker_env(cfg: RunConfig, spec: WorkerSpec, project: str = "") -> dict[str, str]:
    """The spec's environment, plus a keyless gcp_conn_id connection (see the module doc)."""
    return {**spec.env, **credentials.keyless_google_env(cfg.gcp_conn_id, project)}


def custom_job_dict(cfg: RunConfig, ctx: RunContext, spec: WorkerSpec,
                    project: str = "") -> dict:
    """The CustomJob as a proto-plus dict (snake_case field names)."""
    env = [{"name": k, "value": v} for k, v in worker_env(cfg, spec, project).items()]
    step = spec.step or "worker"
    # The controller cannot read Cloud Logging: each replica keeps its own log in the run
    # folder (tasks/provision/worker_logs.py).
    command = worker_logs.wrap(spec.command, ctx.run_uri, step)
    container = {"image_uri": worker_image(cfg), "command": command, "env": env}
    pools = []
    for i, replicas in enumerate(pool_replicas(spec)):
        accelerated = spec.accelerated and pool_computes(spec, POOL_ROLES[i])
        pools.append({"machine_spec": _with_reservation(cfg, spec,
                                                         machine_spec(cfg, accelerated)),
                      "replica_count": replicas, "container_spec": container}
                     if replicas else {})  # an empty pool keeps the later ones in place
    scheduling = {"timeout": dt.timedelta(minutes=cfg.worker_timeout_minutes)}
    if spec.strategy == "multi_worker_mirrored" and len(spec.roles) > 1:
        # Scheduling.restart_job_on_worker_restart (Vertex AI API reference, CustomJobSpec
        # Scheduling): "Restarts the entire CustomJob if a worker gets restarted ... for
        # distributed training jobs that are not resilient to workers leaving and joining".
        scheduling["restart_job_on_worker_restart"] = True
    scheduling.update(capacity.vertex_scheduling(cfg, spec))  # spot / flex-start (docs/spot.md)
    job_spec = {
        "worker_pool_specs": pools,
        "scheduling": scheduling,
        "base_output_directory": {"output_uri_prefix": join_uri(ctx.step_uri(step), "vertex")},
    }
    if cfg.service_account:
        job_spec["service_account"] = cfg.service_account
    if cfg.network:
        job_spec["network"] = cfg.network
    return {"display_name": f"bertflow-{ctx.dag_id}-{ctx.run_key}-{step}"[:128],
            "labels": labels(ctx, step), "job_spec": job_spec}


def _with_reservation(cfg: RunConfig, spec: WorkerSpec, machine: dict) -> dict:
    """MachineSpec.reservation_affinity for capacity reservation (every pool of a step it
    applies to: the reservation must hold each pool's machine type)."""
    affinity = capacity.vertex_reservation_affinity(cfg, spec)
    return {**machine, "reservation_affinity": affinity} if affinity else machine


def custom_job(cfg: RunConfig, ctx: RunContext, spec: WorkerSpec, project: str = ""):
    from google.cloud import aiplatform_v1

    return aiplatform_v1.CustomJob(custom_job_dict(cfg, ctx, spec, project))


def job_json(job) -> dict:
    """A CustomJob as the REST API writes it (camelCase, enum names)."""
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(type(job).pb(job))


def links(name: str) -> tuple[str, str]:
    """Console page and Cloud Logging query of the job `name`."""
    parts = name.split("/")  # projects/P/locations/R/customJobs/ID
    project, region, job_id = parts[1], parts[3], parts[5]
    console = (f"https://console.cloud.google.com/vertex-ai/locations/{region}/training/"
               f"{job_id}/cpu?project={project}")
    query = urllib.parse.quote(f'resource.type="ml_job"\nresource.labels.job_id="{job_id}"')
    logs = f"https://console.cloud.google.com/logs/query;query={query}?project={project}"
    return console, logs


def record_uri(ctx: RunContext, step: str) -> str:
    return join_uri(ctx.step_uri("provision"), "vertex", f"{step}.json")


def _state(job) -> str:
    return job.state.name


def _cancel(client, name: str) -> None:
    """Cancel `name`; a job that already ended is fine (Vertex AI answers FAILED_PRECONDITION,
    which the REST transport raises as BadRequest)."""
    try:
        client.cancel_custom_job(name=name)
    except (exceptions.FailedPrecondition, exceptions.BadRequest):
        if _state(client.get_custom_job(name=name)) in ALIVE:
            raise


# --- the controller ---------------------------------------------------------------------------
class VertexJobController:
    """Runs one step as a CustomJob. `run()` blocks; `stop()` may be called from any thread."""

    def __init__(self, cfg: RunConfig, ctx: RunContext, spec: WorkerSpec, log: Log):
        self.cfg, self.ctx, self.spec, self.log = cfg, ctx, spec, log
        self.step = spec.step or "worker"
        self.name = ""
        self._client = None
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self.running_at: float | None = None

    def run(self) -> None:
        project = resolve_project(self.cfg)
        location = parent(self.cfg, project)
        self._client = client = job_client(self.cfg)
        self._cancel_previous_attempt()
        job = custom_job(self.cfg, self.ctx, self.spec, project)
        try:
            created = client.create_custom_job(parent=location, custom_job=job)
        except exceptions.GoogleAPICallError as err:
            raise WorkerError(f"Vertex AI refused the {self.step} job in {location}: "
                              f"{err.message}") from None
        with self._lock:
            self.name = created.name
        console, logs = links(created.name)
        self._record(state=_state(created), console_url=console, logs_url=logs)
        self.log(f"[vertex] created {created.name}")
        self.log(f"[vertex] console: {console}")
        self.log(f"[vertex] worker logs (Cloud Logging, not streamed here): {logs}")
        final = self._watch(client, created)
        self._record(state=final, console_url=console, logs_url=logs)

    def stop(self) -> None:
        """Cancel the job (Airflow's on_kill); run() then raises WorkerError."""
        self._stopped.set()
        with self._lock:
            name, client = self.name, self._client
        if name and client is not None:
            _cancel(client, name)
            self.log(f"[vertex] cancelled {name}")

    # --- internals ------------------------------------------------------------------------
    def _poll(self, client, delay: float):
        """The job, read again; a transient API error is retried `delay` s apart, up to
        MAX_POLL_ERRORS times in a row (the waits end early on stop())."""
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(TRANSIENT),
            stop=(tenacity.stop_after_attempt(MAX_POLL_ERRORS + 1)
                  | (lambda state: self._stopped.is_set())),
            wait=tenacity.wait_fixed(delay), sleep=self._stopped.wait, reraise=True,
            before_sleep=lambda state: self.log(
                f"[vertex] polling failed ({type(state.outcome.exception()).__name__}); "
                "retrying"))
        return retrying(client.get_custom_job, name=self.name)

    def _watch(self, client, job) -> str:
        created_at = time.monotonic()
        state, delay = _state(job), POLL_MIN_SECONDS
        self.log(f"[vertex] {state}")
        while True:
            if self._stopped.is_set():
                _cancel(client, self.name)
                raise WorkerError(f"stopped: Vertex AI job {self.name} cancelled")
            if state == "JOB_STATE_RUNNING" and self.running_at is None:
                self.running_at = time.time()  # every replica provisioned (attempts.py)
            if state == "JOB_STATE_SUCCEEDED":
                return state
            if state == "JOB_STATE_FAILED":
                message = job.error.message or "(Vertex AI gave no error message)"
                raise WorkerError(f"Vertex AI job {self.name} failed: {message}")
            if state in ("JOB_STATE_CANCELLED", "JOB_STATE_CANCELLING", "JOB_STATE_EXPIRED",
                         "JOB_STATE_PARTIALLY_SUCCEEDED"):
                detail = f": {job.error.message}" if job.error.message else ""
                raise WorkerError(f"Vertex AI job {self.name} ended {state}{detail}")
            waited = time.monotonic() - created_at
            if state in WAITING and waited > self.cfg.schedule_timeout_seconds:
                _cancel(client, self.name)
                raise WorkerError(
                    f"Vertex AI job {self.name} waited {waited:.0f} s in {state} for machines, "
                    f"more than schedule_timeout_seconds={self.cfg.schedule_timeout_seconds}; "
                    f"cancelled it. Check the quota for {self._machines()} in "
                    f"{self.cfg.gcp_region}, or raise schedule_timeout_seconds")
            if self._stopped.wait(delay):
                continue
            try:
                job = self._poll(client, delay)
            except TRANSIENT as err:
                if self._stopped.is_set():
                    continue  # the loop's top cancels
                raise WorkerError(f"cannot read Vertex AI job {self.name} after "
                                  f"{MAX_POLL_ERRORS + 1} tries: {api_message(err)}") from None
            if _state(job) != state:
                state, delay = _state(job), POLL_MIN_SECONDS
                self.log(f"[vertex] {state}")
            else:
                delay = min(delay * POLL_GROWTH, POLL_MAX_SECONDS)

    def _machines(self) -> str:
        spec = machine_spec(self.cfg, self.spec.accelerated)
        acc = spec.get("accelerator_type")
        return f"{spec['machine_type']}" + (f" with {spec['accelerator_count']} x {acc}"
                                            if acc else "")

    def _record(self, **facts) -> None:
        storage.write_json(record_uri(self.ctx, self.step), {
            "job": self.name, "step": self.step, **facts,
            "updated_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")})

    def _cancel_previous_attempt(self) -> None:
        """A retry: cancel the job a dead earlier attempt of this step left alive."""
        uri = record_uri(self.ctx, self.step)
        if not storage.exists(uri):
            return
        name = storage.read_json(uri).get("job")
        if name and _state(self._client.get_custom_job(name=name)) in ALIVE:
            _cancel(self._client, name)
            self.log(f"[vertex] cancelled {name}, left running by an earlier attempt")


# --- the backend ------------------------------------------------------------------------------
class VertexAIBackend(Backend):
    name = "vertex_ai"
    render_format = "json"
    receives_connections = False  # keyless: the workers run as a cloud service account

    def check(self, cfg: RunConfig, ctx: RunContext, dry_run: bool = False) -> list[str]:
        """Local folders (backends.check_remote), then what Vertex AI needs: run folder and
        exports on gs:// (no AWS keys on Vertex workers), a region, a pullable image and a
        valid accelerator (always raised: the rendered job would be wrong)."""
        warnings = check_remote(cfg, dry_run)
        checked_accelerator(cfg)
        machine_spec(cfg, accelerated=True)
        problems = []
        for field in ("artifact_root", "export_uri"):
            value = getattr(cfg, field)
            if value and not storage.is_local(value) and not value.startswith("gs://"):
                problems.append((field, f"vertex_ai needs {field} on gs://: Vertex AI workers "
                                        f"use the job's Google service account and hold no "
                                        f"keys for {value.split('://')[0]}://"))
        if not cfg.gcp_region:
            problems.append(("gcp_region", "vertex_ai needs a region, e.g. us-central1"))
        if not (cfg.worker_image or cfg.image_registry):
            problems.append(("worker_image", f"Vertex AI pulls the image from a registry: set "
                                             f"worker_image, or image_registry for "
                                             f"{worker_image(cfg)}"))
        if problems and not dry_run:
            raise ConfigError(*problems[0])
        return warnings + [f"{field}: {reason} (a real run refuses this)"
                           for field, reason in problems]

    def preflight_checks(self, cfg: RunConfig, ctx: RunContext) -> list:
        from tasks.provision.vertex_ai import preflight

        return preflight.checks(cfg, ctx, self)

    def render(self, cfg: RunConfig, ctx: RunContext, spec: WorkerSpec) -> list[dict]:
        # The project is filled in at submission (the workers' keyless connection names it).
        return [job_json(custom_job(cfg, ctx, spec, cfg.gcp_project))]

    def controller(self, cfg: RunConfig, ctx: RunContext, spec: WorkerSpec, *, log: Log,
                   secrets: dict[str, str]) -> VertexJobController:
        if secrets:
            log("[vertex] Airflow connections are not passed to Vertex AI workers; they run "
                f"as the job's service account ({cfg.service_account or 'the default'})")
        return VertexJobController(cfg, ctx, spec, log)

    def release(self, cfg: RunConfig, ctx: RunContext, log: Log = print) -> dict:
        """Cancel the run's jobs still alive: recorded by its controllers, or labelled with
        the run (a controller that died before writing its record)."""
        names = set()
        for uri in storage.list_uris(join_uri(ctx.step_uri("provision"), "vertex")):
            if uri.endswith(".json"):
                name = storage.read_json(uri).get("job")
                if name:
                    names.add(name)
        if not cfg.gcp_region and not names:
            return {"cancelled_jobs": []}  # no region: no job can have been created
        client = job_client(cfg)
        alive = {}
        for name in sorted(names):
            try:
                alive[name] = _state(client.get_custom_job(name=name))
            except exceptions.NotFound:  # deleted by hand: nothing left to cancel
                pass
        if cfg.gcp_region:
            query = f'labels.{RUN_LABEL}="{run_label(ctx)}" AND labels.managed-by="{MANAGED_BY}"'
            for job in client.list_custom_jobs(request={
                    "parent": parent(cfg, resolve_project(cfg)), "filter": query}):
                alive[job.name] = _state(job)
        cancelled = []
        for name, state in sorted(alive.items()):
            if state in ALIVE:
                _cancel(client, name)
                cancelled.append(name)
                log(f"[vertex] cancelled {name} ({state})")
        return {"cancelled_jobs": cancelled}

    def sweep(self, cfg: RunConfig, log: Log = print) -> list[str]:
        """Cancel bertflow-labelled jobs of the project and region alive for longer than
        worker_timeout_minutes (a backstop: Vertex AI enforces the same timeout)."""
        client = job_client(cfg)
        location = parent(cfg, resolve_project(cfg))
        limit = dt.timedelta(minutes=cfg.worker_timeout_minutes)
        now = dt.datetime.now(dt.timezone.utc)
        cancelled = []
        for job in client.list_custom_jobs(request={
                "parent": location, "filter": f'labels.managed-by="{MANAGED_BY}"'}):
            if _state(job) in ALIVE and job.create_time and now - job.create_time > limit:
                _cancel(client, job.name)
                cancelled.append(job.name)
                log(f"[vertex] cancelled {job.name}: alive longer than "
                    f"worker_timeout_minutes={cfg.worker_timeout_minutes}")
        return cancelled
