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

import re
import threading
import time
from typing import Any

from tasks.io import storage
from tasks.provision import worker_logs
from tasks.config import RunConfig
from tasks.errors import BertflowError, ConfigError
from tasks.provision.backends import Backend, Log, check_remote
from tasks.provision.local.backend import LocalBackend
from tasks.provision.spec import WorkerSpec
from tasks.provision.tpu_vm.client import (
    errors, node_labels, resolve_project, run_of, tpu_client, tpu_state, unusable)
from tasks.provision.tpu_vm.controller import TpuStepController
from tasks.provision.tpu_vm.render import (
    LABEL_EXPIRES, LABEL_RUN, MANAGED_BY, POD_RUNTIME_EXAMPLE, TF_VERSION, TPU_NAME, agent_uri,
    expiry, is_multi_host, queued_resource, resource_id, run_hash, runtime_version, step_request,
    to_dict, tpu_names, worker_image)
from tasks.runs.runlayout import RunContext

_STATE_HINTS = {
    "quota": "request more TPU quota for {type} in {zone}, or pick another tpu_zone or a "
             "smaller accelerator_type",
    "stock": "no {type} capacity came free in {zone} within {timeout}s: try another tpu_zone "
             "or accelerator_type, use a reservation, or raise schedule_timeout_seconds",
}


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
        if multi and (cfg.tpu_address == "local" or not TPU_NAME.match(cfg.tpu_address)):
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
        if multi and not cfg.worker_image:
            self._check_pod_runtime(cfg, version)
        if not (cfg.worker_image or cfg.image_registry):
            reason = ("the TPU VM pulls the trainer image from a registry: set image_registry "
                      "(or worker_image)")
            if not dry_run:
                raise ConfigError("image_registry", reason)
            warnings.append(f"image_registry: {reason} (a real run refuses this)")
        return warnings

    @staticmethod
    def _check_pod_runtime(cfg: RunConfig, version: str) -> None:
        """A multi-host slice's TensorFlow pod runtime serves the TensorFlow of the image
        (bertflow's TPU image: TF_VERSION; a custom worker_image is the user's to match). The
        runtime names its TensorFlow: tpu-vm-tf-X.Y.Z[-pod][-pjrt] (Cloud TPU "TPU software
        versions", cloud.google.com/tpu/docs/runtimes)."""
        match = re.match(r"^tpu-vm-tf-(\d+\.\d+)\.\d+", version)
        image_tf = ".".join(TF_VERSION.split(".")[:2])
        if match is None or match.group(1) != image_tf:
            runs = f"runs TensorFlow {match.group(1)}" if match else "is not a TensorFlow runtime"
            raise ConfigError("tpu_runtime_version", (
                f"{version} {runs}, but the TPU trainer image has TensorFlow {TF_VERSION}: on "
                f"a multi-host slice the runtime's TensorFlow serves the slice, so they must "
                f"match. Set tpu_runtime_version to a {image_tf} pod runtime such as "
                f"{POD_RUNTIME_EXAMPLE} (gcloud compute tpus versions list --zone "
                f"{cfg.tpu_zone or 'ZONE'}), or worker_image to an image with that runtime's "
                f"TensorFlow"))

    def preflight_checks(self, cfg: RunConfig, ctx: RunContext) -> list:
        from tasks.provision.tpu_vm import preflight

        return preflight.checks(cfg, ctx)

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
                "queuedResource": to_dict(queued_resource(cfg, ctx, project))})
        objects.append({"kind": "bertflow/TpuStepRequest",
                        "uri": agent_uri(ctx, "requests", f"{spec.step}.json"),
                        "request": step_request(cfg, spec, f"{spec.step}-001")})
        return objects

    # --- setup: the queued resource, until ACTIVE ---------------------------------------------
    def setup(self, cfg: RunConfig, ctx: RunContext, log: Log = print, *,
              stop: threading.Event | None = None) -> dict:
        """`stop` (set from another thread) ends the wait for ACTIVE."""
        exceptions = errors()
        client, found = tpu_client(cfg)
        project = resolve_project(cfg, found)
        parent = f"projects/{project}/locations/{cfg.tpu_zone}"
        rid = resource_id(cfg, ctx)
        name, node_name = tpu_names(cfg, ctx, project)
        existing = self._get(client, name)
        if existing is not None and run_of(existing) != run_hash(ctx):
            raise ConfigError("tpu_address", f"a queued resource {rid} in {cfg.tpu_zone} "
                                             "belongs to another run or is not bertflow's; "
                                             "choose another TPU name")
        if existing is not None:
            node = self._get(client, node_name)
            if unusable(existing, node):  # failed, or taken back: it never comes back
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
        except errors().NotFound:
            return None

    def current(self, cfg: RunConfig, ctx: RunContext):
        """(queued resource, node) of the run's TPU as the API has them now (None: gone)."""
        client, found = tpu_client(cfg)
        return tuple(self._get(client, name)
                     for name in tpu_names(cfg, ctx, resolve_project(cfg, found)))

    def renew_expiry(self, cfg: RunConfig, ctx: RunContext) -> str:
        """Move the node's expiry label ahead (render.expiry from now), so that a sweep does
        not take a TPU whose step runs past the expiry set at creation. Node labels are
        updated in place (TpuClient.update_node with update_mask "labels"); the queued
        resource's own copy cannot be updated, so the sweep reads the node's. Returns the new
        value."""
        from google.cloud import tpu_v2

        client, found = tpu_client(cfg)
        node_name = tpu_names(cfg, ctx, resolve_project(cfg, found))[1]
        node = client.get_node(name=node_name)
        expires = expiry(cfg)
        client.update_node(node=tpu_v2.Node(name=node_name,
                                            labels={**dict(node.labels), LABEL_EXPIRES: expires}),
                           update_mask={"paths": ["labels"]}).result(timeout=120)
        return expires

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
        exceptions = errors()
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
        return TpuStepController(cfg, ctx, spec, log=log, backend=self)

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
        name, node_name = tpu_names(cfg, ctx, resolve_project(cfg, found))
        existing = self._get(client, name)
        if existing is not None and run_of(existing) != run_hash(ctx):
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
            uri, copies = worker_logs.log_uris(ctx.run_uri, request["step"], "worker", 0,
                                               worker_logs.attempt_of(request.get("env") or {}))
            text = "".join(storage.read_text(c) for c in chunks)
            for target in (uri, *copies):
                storage.write_text(target, text)
            log(f"[tpu] {request['id']} never finished on the VM; its log is kept in {uri}")
            kept.append(uri)
        return kept

    def sweep(self, cfg: RunConfig, log: Log = print) -> list[str]:
        if not cfg.tpu_zone:
            raise ConfigError("tpu_zone", "the sweep needs the zone to look in")
        client, found = tpu_client(cfg)
        parent = f"projects/{resolve_project(cfg, found)}/locations/{cfg.tpu_zone}"
        now = time.time()
        removed = []
        for resource in client.list_queued_resources(parent=parent):
            labels = node_labels(resource)
            if labels.get("managed-by") != MANAGED_BY:
                continue
            nodes = [f"{spec.parent}/nodes/{spec.node_id}" for spec in resource.tpu.node_spec]
            for name in nodes[:1]:  # the live node's labels: a running step renews its expiry
                node = self._get(client, name)
                if node is not None and LABEL_EXPIRES in node.labels:
                    labels = {**labels, LABEL_EXPIRES: node.labels[LABEL_EXPIRES]}
            try:
                expires = int(labels.get(LABEL_EXPIRES, ""))
            except ValueError:
                continue
            if expires > now:
                continue
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))
            log(f"[tpu] {resource.name} expired at {when} (run "
                f"{labels.get(LABEL_RUN)}); deleting")
            self._delete_tpu(client, resource.name, nodes, log)
            removed.append(resource.name)
        return removed


