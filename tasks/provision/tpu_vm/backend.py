"""Cloud TPU VM backend (`provisioner: tpu_vm`): a queued resource per run, the accelerated
steps (train, evaluate) run on the VM by a small agent, the run folder on gs:// carries the
commands, the logs and the results.

Lifecycle
- `setup` (the provision step) creates a queued resource `bertflow-{run hash}` (for a
  multi-host slice: named `tpu_address`) with one node: `accelerator_type`, the runtime
  (`tpu_runtime_version`; for a single host by default the base runtime Google documents for
  the TPU generation, since TensorFlow and libtpu come with the trainer image; a multi-host
  slice needs the TensorFlow pod runtime set explicitly), external IPs or not
  (`tpu_external_ips`),
  labels (managed-by=bertflow, the run's hash and DAG, an expiry time the sweep reads), a
  queueing policy that gives up after `schedule_timeout_seconds`, and a startup script that
  starts the agent (tasks/provision/tpu_vm/agent.py) in the TPU trainer image on worker 0. It
  waits until ACTIVE and fails with the platform's reason (quota, no capacity) and what to
  change.
- `controller(...)` for train/evaluate writes a step request into the run folder
  (`provision/tpu_vm/requests/{step}.json`), streams the agent's log chunks with a `[tpu:0]`
  prefix, and fails with the worker's last lines; `stop()` writes a cancel file. tokenize
  runs before the VM exists and export after it is released, so they run as local processes
  on the Airflow worker (LocalCluster), as with `provisioner: local`.
- A spot TPU the platform takes back mid-step (the agent falls silent, the TPU API says
  SUSPENDED / PREEMPTED) ends the attempt as lost (WorkerLost); the next attempt's controller
  deletes it and queues it again through `setup`, then runs the step, which resumes from its
  checkpoint (tasks/provision/attempts.py, docs/spot.md).
- `release` (teardown) deletes the node, then the queued resource; `sweep` deletes
  bertflow's queued resources whose expiry label has passed.

tpu_address: `local` for a single-host slice (accelerator_type up to 8 chips/cores, e.g.
v4-8, v5litepod-8: TPUClusterResolver finds the chips of the VM it runs on). For a multi-host
slice (v4-16, v5litepod-16, ...) it is the TPU's name: the backend names the node after it,
and the worker on host 0 connects to the whole slice by that name (with tpu_zone /
tpu_project), as Cloud TPU's TensorFlow pod runtime expects.

Credentials: the Airflow side uses `gcp_conn_id` (its key, project) or the ambient account.
The VM uses its own service account (`service_account`) for gs://: no connection secret is
written into the queued resource, the startup script or the run folder. For emulators and
tests, `BERTFLOW_TPU_ENDPOINT=http://HOST:PORT` points the client (REST) at a fake API with
anonymous credentials.
"""
from __future__ import annotations

import os
import re
import shlex
import threading
import time
from typing import Any

from tasks.io import credentials, storage
from tasks.provision import capacity, images, worker_logs
from tasks.config import RunConfig
from tasks.io.uris import join_uri
from tasks.errors import BertflowError, ConfigError, WorkerError
from tasks.provision.attempts import WorkerLost, outcome_of_exit
from tasks.provision.backends import Backend, Log, check_remote, google_label_value
from tasks.provision.local.backend import LocalBackend
from tasks.provision.spec import WorkerSpec
from tasks.provision.spec import run_hash as spec_run_hash
from tasks.runs.runlayout import RunContext

ENDPOINT_ENV = "BERTFLOW_TPU_ENDPOINT"
TF_VERSION = "2.20.0"  # the TPU image's lock (tensorflow-tpu stops at 2.20)
# Single-host runtimes by TPU generation (the accelerator type's prefix): the base images of
# Cloud TPU's "TPU software versions" page (cloud.google.com/tpu/docs/runtimes: v6e
# v2-alpha-tpuv6e, v5p v2-alpha-tpuv5, v5e v2-alpha-tpuv5-lite, v4 and older
# tpu-ubuntu2204-base), which "Run TPU workloads in a Docker container" starts from: the
# container brings the framework. The page's TensorFlow runtimes (tpu-vm-tf-x.y.z[-pod]
# [-pjrt]) stop before 2.20, the TPU image's TensorFlow.
BASE_RUNTIMES = {"v2": "tpu-ubuntu2204-base", "v3": "tpu-ubuntu2204-base",
                 "v4": "tpu-ubuntu2204-base", "v5litepod": "v2-alpha-tpuv5-lite",
                 "v5e": "v2-alpha-tpuv5-lite", "v5p": "v2-alpha-tpuv5",
                 "v6e": "v2-alpha-tpuv6e"}
POD_RUNTIME_EXAMPLE = f"tpu-vm-tf-{TF_VERSION}-pod-pjrt"
# Multi-host TensorFlow (GoogleCloudPlatform/ml-auto-solutions, dags/solutions_team/configs/
# tensorflow/common.py, export_env_variables): a pod run sets TPU_LOAD_LIBRARY=0 (the slice's
# hosts serve the chips) and not the PJRT plug-in the image sets for single hosts;
# tensorflow-tpu 2.20 loads TF_PLUGGABLE_DEVICE_LIBRARY_PATH only when it is not empty.
POD_ENV = {"TPU_LOAD_LIBRARY": "0", "NEXT_PLUGGABLE_DEVICE_USE_C_API": "false",
           "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": ""}
HOST_CHIPS = 8  # the number in an accelerator type up to which a slice is one host
MANAGED_BY = "bertflow"
LABEL_RUN, LABEL_DAG, LABEL_EXPIRES = "bertflow-run", "bertflow-dag", "bertflow-expires"
TAIL_LINES = 30
_ACCELERATOR = re.compile(r"^(v\d+[a-z]*)-(\d+)$")  # v4-8, v5p-16, v5litepod-8, v6e-16
_TPU_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,47}[a-z0-9])?$")
# Capacity the platform took back, by the state names of google-cloud-tpu's tpu_v2 types
# (QueuedResourceState.State, Node.State). Cloud TPU, "Manage queued resources"
# (cloud.google.com/tpu/docs/queued-resources): a queued resource stays assigned "unless you
# delete it or it's preempted. Only TPU Spot VMs and preemptible TPUs are eligible for
# preemption"; SUSPENDING: its resources are being deleted, SUSPENDED: they were deleted and
# it is "no longer eligible for further allocation". "Preemptible TPUs" (.../preemptible): a
# preempted TPU's status changes from READY to PREEMPTED; Node.State's own docstring adds
# TERMINATED (maintenance, or a preemptible node's end of life). "Manage TPU Spot VMs"
# (.../spot): "You can't restart TPU Spot VMs, and you must recreate them after preemption".
SUSPENDED_STATES = ("SUSPENDING", "SUSPENDED")
GONE_NODE_STATES = ("PREEMPTED", "TERMINATED")
_STATE_HINTS = {
    "quota": "request more TPU quota for {type} in {zone}, or pick another tpu_zone or a "
             "smaller accelerator_type",
    "stock": "no {type} capacity came free in {zone} within {timeout}s: try another tpu_zone "
             "or accelerator_type, use a reservation, or raise schedule_timeout_seconds",
}


# --- the run's names and the objects it creates ----------------------------------------------
def is_multi_host(accelerator_type: str) -> bool:
    match = _ACCELERATOR.match(accelerator_type)
    if not match:
        raise ConfigError("accelerator_type", f"{accelerator_type!r} is not a Cloud TPU type "
                                              "such as v4-8, v5litepod-8 or v6e-16")
    return int(match.group(2)) > HOST_CHIPS


def runtime_version(cfg: RunConfig) -> str:
    """tpu_runtime_version, else the base runtime of a single host's TPU generation."""
    if cfg.tpu_runtime_version:
        return cfg.tpu_runtime_version
    if is_multi_host(cfg.accelerator_type):
        raise ConfigError("tpu_runtime_version", (
            f"{cfg.accelerator_type} spans several hosts: TensorFlow on a multi-host slice "
            f"needs the TensorFlow pod runtime of the image's TensorFlow {TF_VERSION} (named "
            f"like {POD_RUNTIME_EXAMPLE}), which Google's \"TPU software versions\" page does "
            f"not list; set tpu_runtime_version to a -pod- runtime that `gcloud compute tpus "
            f"versions list --zone {cfg.tpu_zone or 'ZONE'}` shows"))
    generation = _ACCELERATOR.match(cfg.accelerator_type).group(1)
    if generation not in BASE_RUNTIMES:
        raise ConfigError("tpu_runtime_version", (
            f"no default runtime for TPU generation {generation}: set tpu_runtime_version "
            f"(known generations: {', '.join(BASE_RUNTIMES)})"))
    return BASE_RUNTIMES[generation]


def run_hash(ctx: RunContext) -> str:
    return spec_run_hash(ctx.run_uri, 12)


def resource_id(cfg: RunConfig, ctx: RunContext) -> str:
    """The queued resource's and node's id: the TPU name for a multi-host slice (the worker
    connects by it), else one per run."""
    if is_multi_host(cfg.accelerator_type):
        return cfg.tpu_address
    return f"bertflow-{run_hash(ctx)}"


def tpu_names(cfg: RunConfig, ctx: RunContext, project: str) -> tuple[str, str]:
    """The full names of the run's queued resource and of its node."""
    parent, rid = f"projects/{project}/locations/{cfg.tpu_zone}", resource_id(cfg, ctx)
    return f"{parent}/queuedResources/{rid}", f"{parent}/nodes/{rid}"


def agent_uri(ctx: RunContext, *parts: str) -> str:
    """Where controller and agent meet in the run folder."""
    return join_uri(ctx.step_uri("provision"), "tpu_vm", *parts)


def labels(cfg: RunConfig, ctx: RunContext, now: float | None = None) -> dict[str, str]:
    """Expiry: the queue's patience plus the workers' lifetime, after which a sweep removes
    the queued resource even if no teardown ran."""
    now = time.time() if now is None else now
    expires = int(now + cfg.schedule_timeout_seconds + cfg.worker_timeout_minutes * 60)
    return {"managed-by": MANAGED_BY, LABEL_RUN: run_hash(ctx), LABEL_DAG: google_label_value(ctx.dag_id),
            LABEL_EXPIRES: str(expires)}


def worker_image(cfg: RunConfig) -> str:
    return cfg.worker_image or images.default_image("tpu", cfg.image_registry)


def startup_script(cfg: RunConfig, ctx: RunContext) -> str:
    """Runs at every boot of every host: worker 0 starts the agent in the TPU trainer image.
    Holds no secret: the container reaches gs:// as the VM's service account."""
    image = worker_image(cfg)
    registry = image.split("/", 1)[0] if "/" in image else ""
    login = (f"gcloud auth configure-docker {shlex.quote(registry)} --quiet\n"
             if registry.endswith(("-docker.pkg.dev", "gcr.io")) else "")
    agent = ["python", "-m", "tasks.provision.tpu_vm.agent", "--run-dir", ctx.run_uri]
    return (
        "#!/bin/bash\n"
        f"# bertflow TPU VM agent for run {ctx.run_uri} (tasks/provision/tpu_vm/agent.py)\n"
        "worker=$(curl -s -H 'Metadata-Flavor: Google' http://metadata.google.internal/"
        "computeMetadata/v1/instance/attributes/agent-worker-number || echo 0)\n"
        '[ "${worker:-0}" = "0" ] || exit 0  # multi-host: the TF worker runs on host 0\n'
        f"{login}"
        "docker rm -f bertflow-agent >/dev/null 2>&1\n"
        "docker run -d --restart=on-failure:5 --name bertflow-agent --privileged --net=host "
        "-e TF_USE_LEGACY_KERAS=1 -e PYTHONUNBUFFERED=1 "
        f"--entrypoint python {shlex.quote(image)} {shlex.join(agent[1:])}\n")


def queued_resource(cfg: RunConfig, ctx: RunContext, project: str, now: float | None = None):
    """The QueuedResource (google.cloud.tpu_v2) this run creates."""
    from google.cloud import tpu_v2

    parent = f"projects/{project}/locations/{cfg.tpu_zone}"
    node = tpu_v2.Node(
        accelerator_type=cfg.accelerator_type, runtime_version=runtime_version(cfg),
        description=f"bertflow run {ctx.run_uri}", labels=labels(cfg, ctx, now),
        metadata={"startup-script": startup_script(cfg, ctx)},
        # NetworkConfig.enable_external_ips (Cloud TPU API): "If set to false, the specified
        # subnetwork or network should have Private Google Access enabled" (tpu_external_ips).
        network_config=tpu_v2.NetworkConfig(network=cfg.network,
                                             enable_external_ips=cfg.tpu_external_ips))
    if cfg.service_account:
        node.service_account = tpu_v2.ServiceAccount(
            email=cfg.service_account, scope=["https://www.googleapis.com/auth/cloud-platform"])
    resource = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[
        tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent, node_id=resource_id(cfg, ctx),
                                           node=node)]))
    resource.queueing_policy.valid_until_duration = {"seconds": int(cfg.schedule_timeout_seconds)}
    # QueuedResource tier (tpu_v2): `spot` is the Spot tier; a reservation is named by
    # reservation_name; on_demand leaves both unset (the API's default tier).
    if cfg.capacity == "spot":
        resource.spot = tpu_v2.QueuedResource.Spot()
    elif cfg.capacity == "reservation":
        resource.reservation_name = capacity.tpu_reservation_name(cfg, project)
    return resource


def _to_dict(message) -> dict:
    """A proto-plus message as the REST API's JSON (camelCase, enum names)."""
    from google.protobuf import json_format

    return json_format.MessageToDict(type(message).pb(message))


# --- the client --------------------------------------------------------------------------------
def tpu_client(cfg: RunConfig):
    """(TpuClient over REST, the project its credentials name or None)."""
    from google.cloud import tpu_v2
    from google.cloud.tpu_v2.services.tpu.transports import TpuRestTransport

    endpoint = os.environ.get(ENDPOINT_ENV)
    if endpoint:  # an emulator or a test's fake: no credentials
        from google.auth.credentials import AnonymousCredentials

        scheme, _, host = endpoint.rpartition("://")
        transport = TpuRestTransport(host=host, credentials=AnonymousCredentials(),
                                     url_scheme=scheme or "https")
        return tpu_v2.TpuClient(transport=transport), None
    credentials = project = None
    if cfg.gcp_conn_id:
        from tasks.io.cloud_storage import google_connection

        credentials, project, _ = google_connection(cfg.gcp_conn_id)
    if credentials is None:
        import google.auth

        try:
            credentials, ambient = google.auth.default(
                scopes=["https://www.googleapis.com/auth/cloud-platform"])
        except Exception as err:  # DefaultCredentialsError
            raise BertflowError(f"Cloud TPU: no credentials ({type(err).__name__}); set "
                                "gcp_conn_id or configure application-default "
                                "credentials") from None
        project = project or ambient
    return tpu_v2.TpuClient(credentials=credentials, transport="rest"), project


def _project(cfg: RunConfig, found: str | None) -> str:
    project = cfg.tpu_project or cfg.gcp_project or found
    if not project:
        raise ConfigError("tpu_project", "no Google Cloud project for the TPU: set tpu_project "
                                         "or gcp_project (or the connection's project)")
    return project


def _errors():
    from google.api_core import exceptions

    return exceptions


class TpuVmBackend(Backend):
    name = "tpu_vm"
    render_format = "json"
    receives_connections = False  # keyless: the workers run as a cloud service account
    poll_seconds = 10.0  # how often setup asks for the queued resource's state

    # --- checks ---------------------------------------------------------------------------
    def check(self, cfg: RunConfig, ctx: RunContext, dry_run: bool = False) -> list[str]:
        warnings = check_remote(cfg, dry_run)
        if storage.scheme_of(cfg.artifact_root) == "s3":
            reason = (f"{cfg.artifact_root}: TPU VMs read the run folder and the tokenized "
                      "data from Cloud Storage directly; use a gs:// artifact_root in the "
                      "TPU's region")
            if not dry_run:
                raise ConfigError("artifact_root", reason)
            warnings.append(f"artifact_root: {reason} (a real run refuses this)")
        if cfg.accelerator != "tpu":
            raise ConfigError("accelerator", "provisioner tpu_vm trains on the TPU; set "
                                             "accelerator to tpu")
        if not cfg.tpu_zone:
            raise ConfigError("tpu_zone", "provisioner tpu_vm needs the zone of the TPU, e.g. "
                                          "us-central2-b (v4) or us-west4-a (v5e)")
        if not cfg.accelerator_type:
            raise ConfigError("accelerator_type", "provisioner tpu_vm needs the TPU type, e.g. "
                                                  "v4-8 or v5litepod-8")
        multi = is_multi_host(cfg.accelerator_type)
        if not multi and cfg.tpu_address != "local":
            raise ConfigError("tpu_address", f"{cfg.accelerator_type} is a single-host TPU VM: "
                                             "set tpu_address to local (the worker runs on the "
                                             "VM and uses its chips)")
        if multi and (cfg.tpu_address == "local" or not _TPU_NAME.match(cfg.tpu_address)):
            raise ConfigError("tpu_address", f"{cfg.accelerator_type} spans several hosts: set "
                                             "tpu_address to the name to give the slice "
                                             "(lowercase letters, digits, -; e.g. "
                                             "bertflow-sst2); the worker on host 0 connects "
                                             "to the slice by that name")
        version = runtime_version(cfg)
        if (version.startswith("tpu-vm-tf-") or multi) and ("-pod" in version) != multi:
            raise ConfigError("tpu_runtime_version", (
                f"{cfg.accelerator_type} is multi-host and needs a -pod- runtime such as "
                f"{POD_RUNTIME_EXAMPLE}") if multi else (
                f"{version} is for multi-host slices; leave tpu_runtime_version empty for "
                f"{cfg.accelerator_type} (the base runtime of its generation)"))
        if not (cfg.worker_image or cfg.image_registry):
            reason = ("the TPU VM pulls the trainer image from a registry: set image_registry "
                      "(or worker_image)")
            if not dry_run:
                raise ConfigError("image_registry", reason)
            warnings.append(f"image_registry: {reason} (a real run refuses this)")
        return warnings

    # --- dry run ----------------------------------------------------------------------------
    def render(self, cfg: RunConfig, ctx: RunContext, spec: WorkerSpec) -> list[dict]:
        if not spec.accelerated:
            return [{**obj, "runs_on": "the Airflow worker (local process)"}
                    for obj in LocalBackend().render(cfg, ctx, spec)]
        from tasks.provision.spec import DISTRIBUTED_STEPS

        objects = []
        if spec.step == DISTRIBUTED_STEPS[0]:  # made once, at the provision step
            project = cfg.tpu_project or cfg.gcp_project or "PROJECT"
            parent = f"projects/{project}/locations/{cfg.tpu_zone or 'ZONE'}"
            objects.append({
                "kind": "tpu.googleapis.com/QueuedResource",
                "parent": parent, "queuedResourceId": resource_id(cfg, ctx),
                "queuedResource": _to_dict(queued_resource(cfg, ctx, project))})
        objects.append({"kind": "bertflow/TpuStepRequest",
                        "uri": agent_uri(ctx, "requests", f"{spec.step}.json"),
                        "request": step_request(cfg, spec, f"{spec.step}-001")})
        return objects

    # --- setup: the queued resource, until ACTIVE ---------------------------------------------
    def setup(self, cfg: RunConfig, ctx: RunContext, log: Log = print, *,
              stop: threading.Event | None = None) -> dict:
        """`stop` (set from another thread) ends the wait for ACTIVE."""
        exceptions = _errors()
        client, found = tpu_client(cfg)
        project = _project(cfg, found)
        parent = f"projects/{project}/locations/{cfg.tpu_zone}"
        rid = resource_id(cfg, ctx)
        name, node_name = tpu_names(cfg, ctx, project)
        existing = self._get(client, name)
        if existing is not None and _run_of(existing) != run_hash(ctx):
            raise ConfigError("tpu_address", f"a queued resource {rid} in {cfg.tpu_zone} "
                                             "belongs to another run or is not bertflow's; "
                                             "choose another TPU name")
        if existing is not None:
            node = self._get(client, node_name)
            if _unusable(existing, node):  # failed, or taken back: it never comes back
                log(f"[tpu] {rid} cannot be used ({tpu_state(existing, node)}); deleting it "
                    "and queueing the same TPU again")
                self._delete_tpu(client, name, [node_name], log)
                existing = None
        if existing is None:
            log(f"[tpu] queueing {cfg.accelerator_type} ({runtime_version(cfg)}) as {name}")
            try:
                operation = client.create_queued_resource(
                    parent=parent, queued_resource_id=rid,
                    queued_resource=queued_resource(cfg, ctx, project))
                operation.result(timeout=max(1, min(300, cfg.schedule_timeout_seconds)))
            except exceptions.ResourceExhausted as err:
                raise BertflowError(self._failure(cfg, err.message, "quota")) from None
            except exceptions.AlreadyExists:
                pass  # a concurrent attempt of this very run created it
            except TimeoutError:
                pass  # the create operation still runs; the state tells the rest
            except exceptions.GoogleAPICallError as err:
                raise BertflowError(f"Cloud TPU refused queued resource {rid} in "
                                    f"{cfg.tpu_zone}: {err.message}") from None
        else:
            log(f"[tpu] {rid} exists from an earlier attempt "
                f"({existing.state.state.name}); waiting for it")
        resource = self._wait_active(cfg, client, name, log, stop or threading.Event())
        node = client.get_node(name=node_name)
        log(f"[tpu] {rid} is ACTIVE: {node.accelerator_type}, {node.runtime_version}")
        return {"queued_resource": resource.name, "node": node_name,
                "accelerator_type": cfg.accelerator_type,
                "runtime_version": runtime_version(cfg), "tpu_address": cfg.tpu_address,
                "zone": cfg.tpu_zone, "project": project, "image": worker_image(cfg),
                "expires": int(dict(node.labels).get(LABEL_EXPIRES, "0")) or None,
                "agent_folder": agent_uri(ctx)}

    def _wait_active(self, cfg: RunConfig, client, name: str, log: Log,
                     stop: threading.Event):
        from google.cloud import tpu_v2

        State = tpu_v2.QueuedResourceState.State
        deadline = time.monotonic() + cfg.schedule_timeout_seconds
        last = None
        while True:
            resource = client.get_queued_resource(name=name)
            state = resource.state.state
            if state != last:
                log(f"[tpu] {name.rsplit('/', 1)[1]}: {state.name}")
                last = state
            if state == State.ACTIVE:
                return resource
            if state == State.FAILED:
                message = resource.state.failed_data.error.message or "no reason given"
                kind = "quota" if "quota" in message.lower() else "stock"
                raise BertflowError(self._failure(cfg, message, kind))
            if state in (State.SUSPENDING, State.SUSPENDED, State.DELETING):
                raise BertflowError(f"queued resource {name} is {state.name} (deleted or "
                                    "preempted) before the run could use it; retry the "
                                    "provision task")
            if time.monotonic() >= deadline:
                raise BertflowError(
                    f"queued resource {name} stayed {state.name} for "
                    f"{cfg.schedule_timeout_seconds}s: "
                    + _STATE_HINTS["stock"].format(type=cfg.accelerator_type,
                                                   zone=cfg.tpu_zone,
                                                   timeout=cfg.schedule_timeout_seconds))
            if stop.wait(min(self.poll_seconds, max(0.0, deadline - time.monotonic()))):
                raise BertflowError(f"stopped while waiting for queued resource {name}")

    @staticmethod
    def _failure(cfg: RunConfig, message: str, kind: str) -> str:
        hint = _STATE_HINTS[kind].format(type=cfg.accelerator_type, zone=cfg.tpu_zone,
                                         timeout=cfg.schedule_timeout_seconds)
        return (f"Cloud TPU could not provide {cfg.accelerator_type} in {cfg.tpu_zone}: "
                f"{message} ({hint})")

    @staticmethod
    def _get(client, name: str):
        """The queued resource or node of that name, None when it is gone."""
        get = client.get_node if "/nodes/" in name else client.get_queued_resource
        try:
            return get(name=name)
        except _errors().NotFound:
            return None

    def current(self, cfg: RunConfig, ctx: RunContext):
        """(queued resource, node) of the run's TPU as the API has them now (None: gone)."""
        client, found = tpu_client(cfg)
        return tuple(self._get(client, name)
                     for name in tpu_names(cfg, ctx, _project(cfg, found)))

    def _delete_tpu(self, client, queued: str, nodes: list[str], log: Log) -> dict:
        """Delete the nodes, then the queued resource (forced: with whatever is left on it);
        {"deleted": [...], "already_gone": [...]}."""
        done: dict[str, list[str]] = {"deleted": [], "already_gone": []}
        for what, name in [*(("node", n) for n in nodes), ("queued resource", queued)]:
            gone = self._delete(client, what, name, log, force=what != "node")
            done["deleted" if gone else "already_gone"].append(name)
        return done

    @staticmethod
    def _delete(client, what: str, name: str, log: Log, force: bool = False) -> bool:
        """Delete and wait; False when it was already gone."""
        exceptions = _errors()
        try:
            if what == "node":
                operation = client.delete_node(name=name)
            else:
                operation = client.delete_queued_resource(
                    request={"name": name, "force": force})
            operation.result(timeout=600)
        except exceptions.NotFound:
            return False
        log(f"[tpu] deleted {what} {name}")
        return True

    # --- workers ------------------------------------------------------------------------------
    def controller(self, cfg: RunConfig, ctx: RunContext, spec: WorkerSpec, *, log: Log,
                   secrets: dict[str, str]):
        if not spec.accelerated:  # tokenize (before the VM exists), export (after release)
            return LocalBackend().controller(cfg, ctx, spec, log=log, secrets=secrets)
        # `secrets` stay here: the VM reads gs:// as its own service account.
        return TpuStepController(cfg, ctx, spec, log=log)

    # --- teardown -----------------------------------------------------------------------------
    def release(self, cfg: RunConfig, ctx: RunContext, log: Log = print) -> dict:
        released: dict[str, Any] = {"deleted": [], "already_gone": []}
        local = LocalBackend().release(cfg, ctx, log)  # tokenize/export ran locally
        released.update(local)
        try:
            rid = resource_id(cfg, ctx)
        except ConfigError as err:
            released["skipped"] = str(err)
            return released
        if not cfg.tpu_zone or not rid:
            released["skipped"] = "no tpu_zone or TPU name: nothing was created"
            return released
        try:  # the agent exits when it sees this; deleting the VM stops it anyway
            storage.write_json(agent_uri(ctx, "shutdown.json"), {"at": time.time()})
            released["kept_logs"] = self._keep_unfinished_logs(ctx, log)
        except BertflowError as err:
            log(f"[tpu] could not write the agent's shutdown marker or keep logs: {err}")
        client, found = tpu_client(cfg)
        name, node_name = tpu_names(cfg, ctx, _project(cfg, found))
        existing = self._get(client, name)
        if existing is not None and _run_of(existing) != run_hash(ctx):
            log(f"[tpu] {name} belongs to another run; leaving it")
            released["skipped"] = f"{name} belongs to another run"
            return released
        released.update(self._delete_tpu(client, name, [node_name], log))
        return released

    release_wait_seconds = 60.0  # for the agent to finish a cancelled step's log

    def _keep_unfinished_logs(self, ctx: RunContext, log: Log) -> list[str]:
        """Steps still running on the VM (their controller died): cancel them and let the
        agent, their log's writer, finish; for an agent that does not answer, write the log
        from its chunks before the VM goes."""
        unfinished = []
        for uri in storage.list_uris(agent_uri(ctx, "requests") + "/"):
            request = storage.read_json(uri) if uri.endswith(".json") else None
            if request and not storage.exists(agent_uri(ctx, "status", f"{request['id']}.json")):
                storage.write_json(agent_uri(ctx, "cancel", f"{request['id']}.json"),
                                   {"at": time.time()})
                unfinished.append(request)
        deadline = time.monotonic() + self.release_wait_seconds
        while unfinished and time.monotonic() < deadline and not all(
                storage.exists(agent_uri(ctx, "status", f"{r['id']}.json")) for r in unfinished):
            time.sleep(1.0)
        kept = []
        for request in unfinished:
            if storage.exists(agent_uri(ctx, "status", f"{request['id']}.json")):
                continue  # the agent finished it, log included
            chunks = sorted(u for u in storage.list_uris(agent_uri(ctx, "logs", request["id"])
                                                         + "/") if u.endswith(".txt"))
            uri = worker_logs.log_uri(ctx.run_uri, request["step"], "worker", 0)
            storage.write_text(uri, "".join(storage.read_text(c) for c in chunks))
            log(f"[tpu] {request['id']} never finished on the VM; its log is kept in {uri}")
            kept.append(uri)
        return kept

    def sweep(self, cfg: RunConfig, log: Log = print) -> list[str]:
        if not cfg.tpu_zone:
            raise ConfigError("tpu_zone", "the sweep needs the zone to look in")
        client, found = tpu_client(cfg)
        parent = f"projects/{_project(cfg, found)}/locations/{cfg.tpu_zone}"
        now = time.time()
        removed = []
        for resource in client.list_queued_resources(parent=parent):
            node_labels = _node_labels(resource)
            if node_labels.get("managed-by") != MANAGED_BY:
                continue
            try:
                expires = int(node_labels.get(LABEL_EXPIRES, ""))
            except ValueError:
                continue
            if expires > now:
                continue
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))
            log(f"[tpu] {resource.name} expired at {when} (run "
                f"{node_labels.get(LABEL_RUN)}); deleting")
            self._delete_tpu(client, resource.name, [f"{spec.parent}/nodes/{spec.node_id}"
                                                     for spec in resource.tpu.node_spec], log)
            removed.append(resource.name)
        return removed


def _node_labels(resource) -> dict[str, str]:
    specs = resource.tpu.node_spec
    return dict(specs[0].node.labels) if specs else {}


def _run_of(resource) -> str | None:
    return _node_labels(resource).get(LABEL_RUN)


def tpu_state(resource, node) -> str:
    """The TPU's states for messages: 'queued resource SUSPENDED (by the service), node
    PREEMPTED'."""
    if resource is None:
        return "queued resource gone"
    state = resource.state
    by = state.state_initiator.name.lower()
    text = f"queued resource {state.state.name}" + (
        f" (by the {by})" if state.state.name in SUSPENDED_STATES and by in ("user", "service")
        else "")
    return f"{text}, node {node.state.name if node is not None else 'gone'}"


def _unusable(resource, node) -> bool:
    """Failed, or its capacity is gone: the queued resource must be queued again."""
    return (resource.state.state.name in ("FAILED", *SUSPENDED_STATES)
            or (node is not None and node.state.name in GONE_NODE_STATES))


def taken_back(resource, node) -> bool:
    """The platform reclaimed the spot or preemptible TPU (not a person deleting it)."""
    if resource is None or resource.state.state.name == "FAILED":
        return False
    spot = "spot" in resource or (node is not None and (node.scheduling_config.spot or
                                                        node.scheduling_config.preemptible))
    by_user = resource.state.state_initiator.name == "USER"
    return spot and not by_user and _unusable(resource, node)


# --- running a step on the VM --------------------------------------------------------------------
def step_request(cfg: RunConfig, spec: WorkerSpec, request_id: str) -> dict:
    """What the agent runs. The environment holds no secret: with gcp_conn_id set, the step
    gets that connection without a key, so its storage uses the VM's service account."""
    env = {**spec.env, **credentials.keyless_google_env(
        cfg.gcp_conn_id, cfg.tpu_project or cfg.gcp_project)}
    if is_multi_host(cfg.accelerator_type):
        env.update(POD_ENV)
    return {"id": request_id, "step": spec.step, "command": list(spec.command), "env": env,
            "timeout_seconds": cfg.worker_timeout_minutes * 60}


class TpuStepController:
    """Runs one step on the TPU VM through its agent. `run()` blocks; `stop()` from any
    thread writes the cancel file, and run() then raises.

    A retried Airflow task whose step is still running on the VM (no status yet) attaches to
    it instead of starting it twice; a finished step is run again under the next id."""

    poll_seconds = 2.0
    # No sign of the agent for this long after the request: the VM never started it.
    pickup_seconds: float | None = None  # None: the config's schedule_timeout_seconds
    # The agent's heartbeat did not change for this long while the step ran: it died.
    stale_seconds = 600.0
    # Spot runs: how often the TPU API is asked whether Cloud TPU took the TPU back, so that a
    # reclaim ends the attempt within about this long, not after stale_seconds.
    reclaim_check_seconds = 60.0

    def __init__(self, cfg: RunConfig, ctx: RunContext, spec: WorkerSpec, *, log: Log):
        self.cfg, self.ctx, self.spec, self.log = cfg, ctx, spec, log
        self.request_id: str | None = None
        self._stopped = threading.Event()
        self._seen: set[str] = set()
        self._tail: list[str] = []
        self.running_at: float | None = None

    def _uri(self, *parts: str) -> str:
        return agent_uri(self.ctx, *parts)

    def stop(self) -> None:
        self._stopped.set()
        if self.request_id:
            try:
                storage.write_json(self._uri("cancel", f"{self.request_id}.json"),
                                   {"at": time.time()})
            except BertflowError as err:
                self.log(f"[tpu] could not write the cancel request: {err}")

    def run(self) -> None:
        self.request_id = self._submit()
        if self._stopped.is_set():  # stop() came while submitting
            self.stop()
            raise WorkerError("the TPU step was stopped before it finished")
        pickup = self.pickup_seconds or self.cfg.schedule_timeout_seconds
        started = time.monotonic()
        heartbeat, heartbeat_seen = None, time.monotonic()
        picked_up = False
        checked = time.monotonic()
        while True:
            status = self._status(self.request_id)
            picked_up = self._stream() or picked_up
            if status is not None:
                self._stream()
                if self.running_at is None:  # a step that ended before a heartbeat said so
                    self.running_at = time.time()
                return self._finish(status)
            if self._stopped.is_set():
                raise WorkerError(f"tpu:0 {self.spec.step} was stopped (cancel requested)")
            agent = self._agent()
            if agent is not None and agent != heartbeat:
                heartbeat, heartbeat_seen = agent, time.monotonic()
                picked_up = picked_up or agent.get("running") == self.request_id
                if picked_up and self.running_at is None:
                    self.running_at = time.time()  # the step started on the VM (attempts.py)
            now = time.monotonic()
            if not picked_up and now - started > pickup:
                raise self._silence(
                    f"the TPU VM's agent did not pick up {self.request_id} within {pickup:.0f}s "
                    f"(last heartbeat: {heartbeat or 'none'})",
                    "Check the VM's startup script log (sudo journalctl -u "
                    "google-startup-scripts), the agent's (sudo docker logs bertflow-agent), "
                    "and that its service account can read and write the run folder and pull "
                    "the image")
            if picked_up and self.cfg.capacity == "spot" and \
                    now - checked >= self.reclaim_check_seconds:
                checked = now
                lost = self._reclaimed("the TPU VM went away while running "
                                       f"{self.request_id}")
                if lost is not None:
                    raise lost
            if picked_up and now - heartbeat_seen > self.stale_seconds:
                raise self._silence(
                    f"the TPU VM's agent stopped answering while running {self.request_id} "
                    f"(no heartbeat for {self.stale_seconds:.0f}s)",
                    "The VM was restarted or deleted, or the agent died (sudo docker logs "
                    "bertflow-agent on the VM); retry the task")
            self._stopped.wait(self.poll_seconds)

    def _silence(self, what: str, hint: str) -> WorkerError:
        """The agent fell silent. WorkerLost when the TPU API says the platform took the spot
        TPU back: the request is marked so, and the next attempt queues the TPU again
        (_submit). Anything else stays a failure."""
        try:
            resource, node = TpuVmBackend().current(self.cfg, self.ctx)
        except Exception as err:  # noqa: BLE001 (a diagnosis must not hide the failure)
            return WorkerError(f"{what}; the TPU API could not say why ({err}). {hint}")
        if not taken_back(resource, node):
            return WorkerError(f"{what}; the TPU API says: {tpu_state(resource, node)}. {hint}")
        return self._lost(resource, node, what)

    def _reclaimed(self, what: str) -> WorkerLost | None:
        """WorkerLost (the request marked) if Cloud TPU took the spot TPU back, else None; a
        TPU API that does not answer now is asked again at the next check."""
        try:
            resource, node = TpuVmBackend().current(self.cfg, self.ctx)
        except Exception as err:  # noqa: BLE001 (the heartbeat check still guards the step)
            self.log(f"[tpu] could not ask the TPU API for the TPU's state: {err}")
            return None
        return self._lost(resource, node, what) if taken_back(resource, node) else None

    def _lost(self, resource, node, what: str) -> WorkerLost:
        state = tpu_state(resource, node)
        # A status, so that no agent runs this request again and the next attempt re-creates.
        storage.write_json(self._uri("status", f"{self.request_id}.json"), {
            "id": self.request_id, "exit_code": None, "reclaimed": state, "at": time.time()})
        return WorkerLost(f"Cloud TPU took the spot TPU back ({state}): {what}; the next "
                          "attempt queues the same TPU again and resumes from the checkpoint")

    def _submit(self) -> str:
        request_uri = self._uri("requests", f"{self.spec.step}.json")
        previous = storage.read_json(request_uri) if storage.exists(request_uri) else None
        status = self._status(previous["id"]) if previous else None
        if previous and status is None:
            self.log(f"[tpu] {previous['id']} is still running on the TPU VM (an earlier "
                     "attempt of this task); following it")
            return previous["id"]
        if status and status.get("reclaimed"):
            self._queue_again(previous["id"], status["reclaimed"])
        number = int(previous["id"].rsplit("-", 1)[1]) + 1 if previous else 1
        request_id = f"{self.spec.step}-{number:03d}"
        storage.write_json(request_uri, step_request(self.cfg, self.spec, request_id))
        self.log(f"[tpu] requested {request_id}: {shlex.join(self.spec.command)}")
        return request_id

    def _status(self, request_id: str) -> dict | None:
        """The request's status: the agent's when it ended, the controller's when the TPU
        was taken back (`reclaimed`), None while it runs."""
        uri = self._uri("status", f"{request_id}.json")
        return storage.read_json(uri) if storage.exists(uri) else None

    def _queue_again(self, lost: str, state: str) -> None:
        """The TPU under `lost` was taken back: setup deletes it and queues it again."""
        self.log(f"[tpu] {lost} lost its TPU ({state}); queueing the same TPU again")
        try:
            TpuVmBackend().setup(self.cfg, self.ctx, log=self.log, stop=self._stopped)
        except (BertflowError, _errors().GoogleAPICallError) as err:
            raise WorkerError(f"Cloud TPU took the spot TPU back and queueing it again "
                              f"failed: {err}") from None

    def _agent(self) -> dict | None:
        uri = self._uri("agent.json")
        try:
            return storage.read_json(uri) if storage.exists(uri) else None
        except (BertflowError, ValueError):
            return None

    def _stream(self) -> bool:
        """Log the chunks not seen yet, in order; True when there were any."""
        prefix = self._uri("logs", self.request_id) + "/"
        chunks = sorted(u for u in storage.list_uris(prefix) if u.endswith(".txt"))
        new = [u for u in chunks if u not in self._seen]
        for uri in new:
            for line in storage.read_text(uri).splitlines():
                self.log(f"[tpu:0] {line}")
                self._tail.append(line)
            self._tail = self._tail[-TAIL_LINES:]
            self._seen.add(uri)
        return bool(new) or bool(chunks)

    def _finish(self, status: dict) -> None:
        code = status.get("exit_code")
        if code == 0:
            return
        tail = status.get("tail") or self._tail
        last = next((ln for ln in reversed(tail) if ln.strip()), "(no output)")
        why = " (cancelled)" if status.get("cancelled") else (
            " (timed out)" if status.get("timed_out") else "")
        # 75: preempted and saved (a maintenance event on a live VM); attempts.py runs the
        # step again on the same VM.
        raise outcome_of_exit(code)(f"tpu:0 exited with code {code}{why}: {last}\n--- last "
                                    f"output of tpu:0 ---\n" + "\n".join(tail))
