"""Kubernetes objects for one WorkerSpec: plain dicts, no client import (the dry run and the
schema tests need no cluster).

One step of a run becomes:

- a headless Service (`clusterIP: None`) named `bf-<run hash>-<step>`: it gives every pod the
  DNS name `<job>-<index>.<service>` (pods set `subdomain` to it) and is the owner of the
  step's other objects, so deleting it (or anything by the run's labels) removes the step;
- a Secret `<service>-env` with the run's Airflow connections, only when there are any; pods
  read it through `envFrom`, so no credential is ever written into a pod spec. The dry run
  reads no credential, so it renders no Secret: its pods read `bf-<run hash>-connections`,
  which the user creates (`connections_secret_command` prints the kubectl command);
- one Indexed Job per TF_CONFIG role (`<service>-chief`, `-worker`, `-ps`), `completions =
  parallelism = count`. Pods carry their role and the cluster's addresses; Kubernetes adds
  `JOB_COMPLETION_INDEX` and `python -m tasks` builds TF_CONFIG from the three
  (tasks/provision/launcher.py). Nothing here spells out a TF_CONFIG.

Names stay short: a pod's hostname `<job>-<index>` must fit a 63-character DNS label.
"""
from __future__ import annotations

import json
import math
import re

from tasks.config import TOLERATION, RunConfig
from tasks.errors import ConfigError
from tasks.provision import capacity
from tasks.provision.images import default_image, image_kind
from tasks.provision.launcher import CLUSTER_ENV, ROLE_ENV
from tasks.provision.spec import WorkerSpec
from tasks.provision.spec import run_hash as spec_run_hash
from tasks.runs.runlayout import RunContext

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "bertflow"
RUN_HASH = "bertflow.dev/run-hash"
DAG_ID = "bertflow.dev/dag-id"
RUN_KEY = "bertflow.dev/run-key"
STEP = "bertflow.dev/step"
ROLE = "bertflow.dev/role"
# Set by the Job controller on every pod of an Indexed Job (annotation; also a label since
# Kubernetes 1.28).
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
CONTAINER = "worker"

# The first task's port; every task of a step gets its own (2222, 2223, ...). On a cluster
# one port would do (each pod has its own IP), but TensorFlow's gRPC server binds
# 0.0.0.0:<port>, and the equivalence tests run all pods of a step on one host.
BASE_PORT = 2222
# Finished Jobs (and their pods, with their logs) stay this long for `kubectl logs`; the
# controller and the release step normally delete them sooner.
TTL_SECONDS_AFTER_FINISHED = 3600

GPU_RESOURCE = "nvidia.com/gpu"
TPU_RESOURCE = "google.com/tpu"
GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"
GKE_TPU_ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
GKE_TPU_TOPOLOGY = "cloud.google.com/gke-tpu-topology"

# GKE TPU slices by node label cloud.google.com/gke-tpu-accelerator: topology dimensions,
# chips per VM of a multi-host slice, and the single-host topologies with their chips per VM
# (GKE "Plan TPUs in GKE" / "TPUs in GKE" topology tables: v4 and v5p are 3D slices of 4-chip
# VMs, ct4p-/ct5p-hightpu-4t; v5e and v6e are 2D, one VM up to 2x4 = 8 chips,
# ct5lp-hightpu-1t/4t/8t and ct6e-standard-1t/4t/8t, and 4-chip VMs beyond).
GKE_TPU_TYPES: dict[str, tuple[int, int, dict[str, int]]] = {
    "tpu-v4-podslice": (3, 4, {"2x2x1": 4}),
    "tpu-v5p-slice": (3, 4, {"2x2x1": 4}),
    "tpu-v5-lite-podslice": (2, 4, {"1x1": 1, "2x2": 4, "2x4": 8}),
    "tpu-v6e-slice": (2, 4, {"1x1": 1, "2x2": 4, "2x4": 8}),
}

# NCCL keeps its intra-node buffers in /dev/shm, which a container gets at 64 MB (the
# container runtime's default), and fails to initialise without room ("failed to extend
# /dev/shm/nccl-..."): multi-GPU pods mount a memory-backed emptyDir there, sized as NVIDIA's
# NCCL User Guide, Troubleshooting, "Shared memory", Docker: `--shm-size=1g`. Its pages count
# against the pod's memory limit (Kubernetes docs, Volumes: emptyDir, sizeLimit).
SHM_VOLUME = "dshm"
SHM_SIZE_LIMIT = "1Gi"

_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9._-]+")


# --- names and labels -------------------------------------------------------------------
def run_hash(ctx: RunContext) -> str:
    """8 hex digits naming the run (its folder URI) in object names and the run label."""
    return spec_run_hash(ctx.run_uri, 8)


def label_value(text: str) -> str:
    """`text` as a valid label value (<= 63 chars of [A-Za-z0-9._-], alphanumeric ends).
    Informational only: the run hash label is what selects a run."""
    value = _LABEL_VALUE_BAD.sub("_", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def _dns_label(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "step"


def service_name(ctx: RunContext, step: str) -> str:
    return f"bf-{run_hash(ctx)}-{_dns_label(step)[:20]}"


def job_name(ctx: RunContext, step: str, role: str) -> str:
    return f"{service_name(ctx, step)}-{role}"


def secret_name(ctx: RunContext, step: str) -> str:
    return f"{service_name(ctx, step)}-env"


def run_labels(ctx: RunContext) -> dict[str, str]:
    return {MANAGED_BY: MANAGER, DAG_ID: label_value(ctx.dag_id),
            RUN_KEY: label_value(ctx.run_key), RUN_HASH: run_hash(ctx)}


def selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def run_selector(ctx: RunContext) -> str:
    """Every object of the run (release)."""
    return selector({MANAGED_BY: MANAGER, RUN_HASH: run_hash(ctx)})


def step_selector(ctx: RunContext, step: str) -> str:
    """Every object of one step of the run (the controller's teardown, stop())."""
    return selector({MANAGED_BY: MANAGER, RUN_HASH: run_hash(ctx), STEP: _dns_label(step)})


# --- accelerators -----------------------------------------------------------------------
def accelerator_kind(cfg: RunConfig, spec: WorkerSpec) -> str:
    """cpu, gpu or tpu: what the step's accelerated pods get (tokenize and export: cpu)."""
    return image_kind(cfg.accelerator, cfg.accelerator_type) if spec.accelerated else "cpu"


# Off GKE, nodes carry no cloud.google.com/gke-* labels. Their own GPU labels: the Kubernetes
# well-known node.kubernetes.io/instance-type (kubernetes.io/docs/reference/labels-annotations-
# taints), and on EKS with Karpenter karpenter.k8s.aws/instance-gpu-name (Amazon EKS User
# Guide, "Target AI/ML workloads to specific nodes with labels", docs.aws.amazon.com/eks/
# latest/userguide/ml-workload-placement.html; aws/karpenter-provider-aws's label list).
OFF_GKE_GPU_SELECTORS = {
    "eks": "node.kubernetes.io/instance-type=g6.xlarge",
    "karpenter": "karpenter.k8s.aws/instance-gpu-name=l4",
}


def accelerator_problems(cfg: RunConfig) -> list[tuple[str, str]]:
    """(field, reason) for an accelerator layout this backend cannot run: GKE's node labels
    on another platform, a TPU layout GKE cannot run."""
    kind = image_kind(cfg.accelerator, cfg.accelerator_type)
    if cfg.k8s_platform != "gke" and kind == "gpu" and cfg.accelerator_type:
        example = OFF_GKE_GPU_SELECTORS[cfg.k8s_platform]
        return [("accelerator_type", (
            f"{cfg.accelerator_type} selects nodes by GKE's label {GKE_ACCELERATOR}, which "
            f"k8s_platform {cfg.k8s_platform} nodes do not carry (the pods would never be "
            f"scheduled); leave accelerator_type empty and select the GPU nodes with "
            f"node_selector, e.g. {example}"))]
    if cfg.k8s_platform != "gke" and kind == "tpu":
        return [("accelerator", f"TPUs on Kubernetes are GKE's (cloud.google.com/gke-tpu-* "
                                f"node labels), not {cfg.k8s_platform}'s; set k8s_platform "
                                f"gke, or accelerator gpu or cpu")]
    if kind != "tpu":
        return []
    if cfg.num_workers > 1:
        return [("num_workers", f"{cfg.num_workers} TPU hosts: TensorFlow's TPUStrategy on a "
                                "multi-host GKE TPU slice is not supported by the kubernetes "
                                "backend; use provisioner tpu_vm (a multi-host TPU VM), or "
                                "num_workers 1 (a single-host slice)")]
    problems: list[tuple[str, str]] = []
    if cfg.devices_per_worker <= 0:
        problems.append(("devices_per_worker", "the number of TPU chips per host (google.com/"
                                               "tpu), e.g. 4 for a 2x2 v5e slice; 0 is not "
                                               "allowed on kubernetes"))
    if not cfg.accelerator_type:
        problems.append(("accelerator_type", "the GKE TPU node label cloud.google.com/gke-tpu-"
                                             "accelerator, e.g. tpu-v5-lite-podslice"))
    if not cfg.tpu_topology:
        problems.append(("tpu_topology", "the GKE TPU slice topology (node label cloud."
                                         "google.com/gke-tpu-topology), e.g. 2x2"))
    if cfg.tpu_address != "local":
        problems.append(("tpu_address", f"a single-host GKE TPU slice is attached to the pod: "
                                        f"set 'local' (got {cfg.tpu_address!r})"))
    if cfg.accelerator_type and cfg.tpu_topology:
        problems += _tpu_shape_problems(cfg)
    return problems


def _tolerations(cfg: RunConfig, spec: WorkerSpec, kind: str) -> list[dict]:
    out = []
    if kind == "gpu":
        out.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    elif kind == "tpu":
        out.append({"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    out += capacity.k8s_tolerations(cfg, spec)
    for entry in cfg.tolerations or ():
        key, value, effect = TOLERATION.match(entry).groups()
        out.append({"key": key, "operator": "Equal", "value": value, "effect": effect}
                   if value is not None else {"key": key, "operator": "Exists",
                                              "effect": effect})
    return out


def _node_selector(cfg: RunConfig, spec: WorkerSpec, kind: str) -> dict[str, str]:
    out = {}
    if kind == "gpu" and cfg.accelerator_type:
        out[GKE_ACCELERATOR] = cfg.accelerator_type
    elif kind == "tpu":
        out[GKE_TPU_ACCELERATOR] = cfg.accelerator_type
        out[GKE_TPU_TOPOLOGY] = cfg.tpu_topology
    out.update(capacity.k8s_node_selector(cfg, spec))
    out.update(cfg.node_selector or {})
    return out


def gke_tpu_hosts(accelerator_type: str, topology: str) -> tuple[int, int]:
    """(hosts, chips per host) of a GKE TPU slice, from GKE_TPU_TYPES; ConfigError naming the
    field for a type or topology GKE does not offer."""
    if accelerator_type not in GKE_TPU_TYPES:
        raise ConfigError("accelerator_type", f"{accelerator_type!r} is not a GKE TPU node "
                                              f"label; use one of {', '.join(GKE_TPU_TYPES)}")
    dims, host_chips, single_host = GKE_TPU_TYPES[accelerator_type]
    sizes = [int(d) for d in topology.split("x")]
    if len(sizes) != dims or not all(sizes):
        example = "2x2x1" if dims == 3 else "2x2"
        raise ConfigError("tpu_topology", f"{accelerator_type} slices have {dims}-dimensional "
                                          f"topologies such as {example}, not {topology!r}")
    if topology in single_host:
        return 1, single_host[topology]
    chips = math.prod(sizes)
    if chips % host_chips:
        raise ConfigError("tpu_topology", f"{topology} ({chips} chips) is not a "
                                          f"{accelerator_type} slice: multi-host slices are "
                                          f"made of {host_chips}-chip hosts")
    return chips // host_chips, host_chips


def _tpu_shape_problems(cfg: RunConfig) -> list[tuple[str, str]]:
    """The topology's hosts must be the workers and its chips per host the pod's request."""
    try:
        hosts, chips = gke_tpu_hosts(cfg.accelerator_type, cfg.tpu_topology)
    except ConfigError as err:
        return [(err.field, err.reason)]
    singles = ", ".join(GKE_TPU_TYPES[cfg.accelerator_type][2])
    if hosts != cfg.num_workers:
        return [("num_workers", f"tpu_topology {cfg.tpu_topology} on {cfg.accelerator_type} is "
                                f"{hosts * chips} chips on {hosts} hosts of {chips}: it needs "
                                f"num_workers {hosts} (one pod per host), got "
                                f"{cfg.num_workers}. The kubernetes backend runs single-host "
                                f"slices only: choose a topology of one host ({singles}), or "
                                "provisioner tpu_vm")]
    if cfg.devices_per_worker and cfg.devices_per_worker != chips:
        return [("devices_per_worker", f"tpu_topology {cfg.tpu_topology} on "
                                       f"{cfg.accelerator_type} is one host with {chips} "
                                       f"chips: the pod must request all of them "
                                       f"(google.com/tpu {chips}); set devices_per_worker "
                                       f"{chips}, got {cfg.devices_per_worker}")]
    return []


def _resources(cfg: RunConfig, kind: str) -> dict:
    requests, limits = {}, {}
    if cfg.worker_cpu:
        requests["cpu"] = cfg.worker_cpu
    if cfg.worker_memory:
        requests["memory"] = limits["memory"] = cfg.worker_memory
    if kind == "gpu":
        limits[GPU_RESOURCE] = str(cfg.devices_per_worker or 1)
    elif kind == "tpu":
        limits[TPU_RESOURCE] = str(cfg.devices_per_worker)
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def _role_kind(spec: WorkerSpec, role: str, kind: str) -> str:
    """ps tasks, and the parameter_server chief (a coordinator), compute nothing: CPU pods."""
    if role == "ps" or (role == "chief" and spec.strategy == "parameter_server"):
        return "cpu"
    return kind


# --- objects ----------------------------------------------------------------------------
def cluster_addresses(ctx: RunContext, spec: WorkerSpec,
                      base_port: int = BASE_PORT) -> dict[str, list[str]]:
    """TF cluster of the step: `<job>-<index>.<service>:<port>`, one port per task."""
    service = service_name(ctx, spec.step)
    out: dict[str, list[str]] = {}
    for port, (role, index) in enumerate(spec.roles, start=base_port):
        out.setdefault(role, []).append(f"{job_name(ctx, spec.step, role)}-{index}.{service}:"
                                        f"{port}")
    return out


def _meta(name: str, cfg: RunConfig, labels: dict, owner: dict | None) -> dict:
    meta = {"name": name, "namespace": cfg.k8s_namespace, "labels": labels}
    if owner:
        meta["ownerReferences"] = [owner]
    return meta


def owner_reference(service: str, uid: str) -> dict:
    """No blockOwnerDeletion: with the OwnerReferencesPermissionEnforcement admission plugin
    (OpenShift, among others) setting it needs update on services/finalizers, and it only
    matters to Foreground deletion of the owner; the controller deletes Background."""
    return {"apiVersion": "v1", "kind": "Service", "name": service, "uid": uid}


def connections_secret_name(ctx: RunContext) -> str:
    """The Secret a user creates for the dry run's pods (one per run, every step reads it)."""
    return f"bf-{run_hash(ctx)}-connections"


def connections_secret_command(cfg: RunConfig, ctx: RunContext, keys: list[str]) -> str:
    """The kubectl command that creates the dry run's Secret: key names, values from shell
    variables of the same names (each an Airflow connection as JSON or URI), never printed."""
    literals = " ".join(f'--from-literal={k}="${k}"' for k in sorted(keys))
    return (f"kubectl create secret generic {connections_secret_name(ctx)} "
            f"--namespace {cfg.k8s_namespace} {literals}")


def render_objects(cfg: RunConfig, ctx: RunContext, spec: WorkerSpec, *,
                   secret_keys: list[str] = (), secret_values: dict[str, str] | None = None,
                   owner_uid: str | None = None, base_port: int = BASE_PORT) -> list[dict]:
    """[Service, Secret?, Job per role] for `spec`, in creation order.

    `secret_values` (the controller) become the Secret's data; with `secret_keys` alone (the
    dry run) no Secret is rendered and pods read connections_secret_name(ctx), which the
    user creates. `owner_uid` is the created Service's uid; without it (dry run) no
    ownerReferences are written.
    """
    step = spec.step or "step"
    service = service_name(ctx, step)
    base = {**run_labels(ctx), STEP: _dns_label(step)}
    owner = owner_reference(service, owner_uid) if owner_uid else None
    spec = spec if spec.step else WorkerSpec(**{**spec.to_dict(), "step": step})
    addresses = cluster_addresses(ctx, spec, base_port) if spec.cluster else {}
    ports = list(range(base_port, base_port + len(spec.roles))) if spec.cluster else []

    service_spec = {"clusterIP": "None",
                    "selector": {MANAGED_BY: MANAGER, RUN_HASH: run_hash(ctx), STEP: base[STEP]},
                    # Peers must resolve each other while they start, before readiness.
                    "publishNotReadyAddresses": True}
    if ports:
        service_spec["ports"] = [{"name": f"tf-{p}", "port": p, "targetPort": p,
                                  "protocol": "TCP"} for p in ports]
    objects = [{"apiVersion": "v1", "kind": "Service",
                "metadata": _meta(service, cfg, dict(base), None), "spec": service_spec}]

    env_from = []
    if secret_values:
        objects.append({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                        "metadata": _meta(secret_name(ctx, step), cfg, dict(base), owner),
                        "stringData": {k: secret_values[k] for k in sorted(secret_values)}})
        env_from = [{"secretRef": {"name": secret_name(ctx, step)}}]
    elif secret_keys:  # dry run: no credential is read; the user creates the Secret
        env_from = [{"secretRef": {"name": connections_secret_name(ctx)}}]

    kind = accelerator_kind(cfg, spec)
    roles = [(role, spec.cluster[role]) for role in ("chief", "worker", "ps")
             if spec.cluster.get(role)] or [("worker", 1)]
    first_port = {role: base_port + next(i for i, (r, _) in enumerate(spec.roles) if r == role)
                  for role, _ in roles} if ports else {}
    for role, count in roles:
        role_kind = _role_kind(spec, role, kind)
        labels = {**base, ROLE: role}
        env = []
        if addresses:
            env += [{"name": ROLE_ENV, "value": role},
                    {"name": CLUSTER_ENV, "value": json.dumps(addresses, sort_keys=True)}]
        env += [{"name": k, "value": v} for k, v in spec.env.items()]
        container = {"name": CONTAINER,
                     "image": cfg.worker_image or default_image(role_kind, cfg.image_registry),
                     # The command's "python" is the image's interpreter.
                     "command": list(spec.command), "env": env}
        if env_from:
            container["envFrom"] = env_from
        if ports:
            container["ports"] = [{"name": f"tf-{p}", "containerPort": p, "protocol": "TCP"}
                                  for p in range(first_port[role], first_port[role] + count)]
        resources = _resources(cfg, role_kind)
        if resources:
            container["resources"] = resources
        pod_spec = {"restartPolicy": "Never", "subdomain": service, "containers": [container]}
        if role_kind == "gpu" and (cfg.devices_per_worker or 1) > 1:
            container["volumeMounts"] = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
            pod_spec["volumes"] = [{"name": SHM_VOLUME, "emptyDir": {
                "medium": "Memory", "sizeLimit": SHM_SIZE_LIMIT}}]
        if cfg.service_account:
            pod_spec["serviceAccountName"] = cfg.service_account
        if cfg.image_pull_secrets:
            pod_spec["imagePullSecrets"] = [{"name": n} for n in cfg.image_pull_secrets]
        node_selector = _node_selector(cfg, spec, role_kind)
        if node_selector:
            pod_spec["nodeSelector"] = node_selector
        tolerations = _tolerations(cfg, spec, role_kind)
        if tolerations:
            pod_spec["tolerations"] = tolerations
        grace = capacity.k8s_termination_grace(cfg, spec)
        if grace:
            pod_spec["terminationGracePeriodSeconds"] = grace
        objects.append({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": _meta(job_name(ctx, step, role), cfg, labels, owner),
            "spec": {
                "completionMode": "Indexed", "completions": count, "parallelism": count,
                "backoffLimit": 0,  # retries are Airflow's: a failed pod fails the step
                "ttlSecondsAfterFinished": TTL_SECONDS_AFTER_FINISHED,
                "activeDeadlineSeconds": cfg.worker_timeout_minutes * 60,
                "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
            },
        })
    return objects


def check_accelerators(cfg: RunConfig) -> None:
    problems = accelerator_problems(cfg)
    if problems:
        raise ConfigError(*problems[0])
