"""Spot, flex-start and reserved capacity (RunConfig `capacity`, `reservation`, `k8s_platform`)
in each backend's own fields. docs/spot.md lists every value with its source.

Capacity applies to the accelerator steps (train, evaluate: WorkerSpec.accelerated); the CPU
steps (data, tokenize, export) run on demand unless `capacity_cpu_steps` is on (`applies`).

`check(cfg)` refuses a capacity the chosen backend cannot express, before any work; the
renderers (k8s_render, vertex_ai, tpu_vm) take their fields from the functions here.
"""
from __future__ import annotations

import datetime as dt
import re

from tasks.config import RunConfig
from tasks.errors import ConfigError

# GKE "Use Spot VMs in GKE" / "Spot Pods": spot nodes carry the label
# cloud.google.com/gke-spot=true, and pods select them with that nodeSelector. Autopilot
# taints Spot Pods' nodes; a Standard pool is tainted when created with --node-taints
# cloud.google.com/gke-spot=true:NoSchedule. The toleration is harmless on untainted pools.
GKE_SPOT = "cloud.google.com/gke-spot"
# GKE "Consuming reserved zonal resources": a pod selects a specific reservation with the
# nodeSelectors cloud.google.com/reservation-name and cloud.google.com/reservation-affinity.
GKE_RESERVATION_NAME = "cloud.google.com/reservation-name"
GKE_RESERVATION_AFFINITY = "cloud.google.com/reservation-affinity"
# EKS "Managed node groups" (capacity types): nodes are labelled
# eks.amazonaws.com/capacityType=ON_DEMAND or SPOT.
EKS_CAPACITY_TYPE = "eks.amazonaws.com/capacityType"
# Karpenter "NodePools" (well-known labels): karpenter.sh/capacity-type is spot or on-demand.
KARPENTER_CAPACITY_TYPE = "karpenter.sh/capacity-type"

# Vertex AI: google.cloud.aiplatform_v1 Scheduling.Strategy (SPOT = 4, FLEX_START = 6 in the
# installed client) and MachineSpec.reservation_affinity (ReservationAffinity: "To target a
# SPECIFIC_RESERVATION by name, use compute.googleapis.com/reservation-name as the key";
# values: "the full resource name of the reservation").
VERTEX_STRATEGY = {"spot": "SPOT", "flex_start": "FLEX_START"}
VERTEX_RESERVATION_KEY = "compute.googleapis.com/reservation-name"
VERTEX_RESERVATION = re.compile(r"^projects/[^/]+/zones/[^/]+/reservations/[^/]+$")
# Cloud TPU: google.cloud.tpu_v2 QueuedResource.reservation_name, "Format:
# projects/{project}/locations/{zone}/reservations/{reservation}".
TPU_RESERVATION = re.compile(r"^projects/[^/]+/locations/[^/]+/reservations/[^/]+$")
RESERVATION_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # a Compute Engine name

# capacity values each backend can express.
SUPPORTED = {
    "local": ("on_demand",),
    "kubernetes": ("on_demand", "spot", "reservation"),
    "vertex_ai": ("on_demand", "spot", "flex_start", "reservation"),
    "tpu_vm": ("on_demand", "spot", "reservation"),
}


def applies(cfg: RunConfig, spec) -> bool:
    """Whether the step of `spec` (a WorkerSpec) runs on cfg.capacity: the accelerator steps
    always, the CPU steps only with capacity_cpu_steps."""
    return spec.accelerated or cfg.capacity_cpu_steps


def steps_on(cfg: RunConfig) -> str:
    """One line for the dry run: which steps run on which capacity."""
    from tasks.provision.spec import DISTRIBUTED_STEPS, WORKER_STEPS

    if cfg.capacity == "on_demand":
        return "capacity on_demand: every step"
    cpu = [s for s in WORKER_STEPS if s not in DISTRIBUTED_STEPS]
    if cfg.capacity_cpu_steps:
        return f"{describe(cfg)}: every step ({', '.join(WORKER_STEPS)}; capacity_cpu_steps)"
    return (f"{describe(cfg)}: {', '.join(DISTRIBUTED_STEPS)}; on demand: {', '.join(cpu)} "
            "(set capacity_cpu_steps to put them on the same capacity)")


def check(cfg: RunConfig) -> None:
    """ConfigError for a capacity (or reservation name) the backend cannot use."""
    allowed = SUPPORTED[cfg.provisioner]
    if cfg.capacity not in allowed:
        hint = {"local": "local workers run on this machine; capacity applies to remote "
                         "backends",
                "kubernetes": "flex-start on Kubernetes is a node pool's setting: select "
                              "that pool with node_selector",
                "tpu_vm": "a queued resource waits for capacity already "
                          "(schedule_timeout_seconds); use spot or on_demand"}
        raise ConfigError("capacity", f"{cfg.capacity} is not available on provisioner "
                                      f"{cfg.provisioner} (it takes {', '.join(allowed)}); "
                                      f"{hint.get(cfg.provisioner, '')}".rstrip("; "))
    if cfg.capacity == "flex_start":
        _check_flex_start(cfg)
    if cfg.capacity != "reservation":
        return
    name = cfg.reservation
    if cfg.provisioner == "kubernetes":
        if cfg.k8s_platform != "gke":
            raise ConfigError("capacity", f"bertflow selects reservations by GKE's node labels "
                                          f"only; on {cfg.k8s_platform}, select the reserved "
                                          "nodes with node_selector and set capacity on_demand")
        if not RESERVATION_NAME.match(name):
            raise ConfigError("reservation", f"{name!r} is not a reservation name (lowercase "
                                             "letters, digits and '-'); GKE takes the name only")
    elif cfg.provisioner == "vertex_ai" and not VERTEX_RESERVATION.match(name):
        raise ConfigError("reservation", f"{name!r}: Vertex AI needs the reservation's full "
                                         "name, projects/PROJECT/zones/ZONE/reservations/NAME")
    elif cfg.provisioner == "tpu_vm" and not (TPU_RESERVATION.match(name)
                                              or RESERVATION_NAME.match(name)):
        raise ConfigError("reservation", f"{name!r}: give the reservation's name in tpu_zone, "
                                         "or projects/P/locations/ZONE/reservations/NAME")


# Vertex AI "Schedule training jobs based on resource availability" (Dynamic Workload
# Scheduler, cloud.google.com/vertex-ai/docs/training/schedule-jobs-dws, read 2026-12-04): the
# job "requests L4, A100, H100, H200, or B200 GPUs", has a timeout of 7 days or less, and uses
# the same machine configuration for all worker pools. The GPUs as aiplatform_v1
# AcceleratorType names:
FLEX_START_GPUS = ("NVIDIA_L4", "NVIDIA_TESLA_A100", "NVIDIA_A100_80GB", "NVIDIA_H100_80GB",
                   "NVIDIA_H100_MEGA_80GB", "NVIDIA_H200_141GB", "NVIDIA_B200")
FLEX_START_DOCS = "cloud.google.com/vertex-ai/docs/training/schedule-jobs-dws"
FLEX_START_MAX_MINUTES = 7 * 24 * 60


def _check_flex_start(cfg: RunConfig) -> None:
    if not cfg.accelerator_type.startswith("NVIDIA_"):
        raise ConfigError("capacity", "flex_start (Dynamic Workload Scheduler) needs GPU "
                                      "workers: set accelerator_type, e.g. NVIDIA_L4")
    if cfg.accelerator_type not in FLEX_START_GPUS:
        raise ConfigError("accelerator_type", (
            f"flex_start (Dynamic Workload Scheduler) does not serve {cfg.accelerator_type}; "
            f"it serves {', '.join(FLEX_START_GPUS)} ({FLEX_START_DOCS}). Pick one of those, "
            f"or capacity spot or on_demand for {cfg.accelerator_type}"))
    if cfg.worker_timeout_minutes > FLEX_START_MAX_MINUTES:
        raise ConfigError("worker_timeout_minutes", f"flex_start jobs run at most 7 days "
                                                    f"({FLEX_START_MAX_MINUTES} minutes)")
    if cfg.num_ps or cfg.strategy == "parameter_server":
        raise ConfigError("capacity", "flex_start needs the same machines in every worker "
                                      "pool, and parameter servers run on CPU machines; use "
                                      "multi_worker_mirrored, or capacity spot")
    if cfg.capacity_cpu_steps:
        raise ConfigError("capacity_cpu_steps", "flex_start serves GPU machines only, and the "
                                                "CPU steps (data, tokenize, export) have none; "
                                                "turn capacity_cpu_steps off (they run on "
                                                "demand), or use capacity spot")


# --- Kubernetes ---------------------------------------------------------------------------
def k8s_node_selector(cfg: RunConfig, spec) -> dict[str, str]:
    if not applies(cfg, spec):
        return {}
    if cfg.capacity == "spot":
        return {"gke": {GKE_SPOT: "true"}, "eks": {EKS_CAPACITY_TYPE: "SPOT"},
                "karpenter": {KARPENTER_CAPACITY_TYPE: "spot"}}[cfg.k8s_platform]
    if cfg.capacity == "reservation":
        return {GKE_RESERVATION_NAME: cfg.reservation, GKE_RESERVATION_AFFINITY: "specific"}
    return {}


# EC2 warns a Spot instance 2 minutes before it goes (Amazon EC2 User Guide, "Spot Instance
# interruption notices"). Karpenter's interruption handling or aws-node-termination-handler
# drains the node at the warning, and each pod then has its terminationGracePeriodSeconds
# (30 s by default, Kubernetes PodSpec) to save. 110 s leaves the preemption save most of the
# warning (docs/preemption.md). GKE's Spot VMs give pods 15 s whatever a pod asks ("Spot VMs").
EKS_SPOT_GRACE_SECONDS = 110


def k8s_termination_grace(cfg: RunConfig, spec) -> int | None:
    """terminationGracePeriodSeconds for the pods of `spec`'s step, or None for the default."""
    if cfg.capacity == "spot" and cfg.k8s_platform in ("eks", "karpenter") and applies(
            cfg, spec):
        return EKS_SPOT_GRACE_SECONDS
    return None


def k8s_tolerations(cfg: RunConfig, spec) -> list[dict]:
    if cfg.capacity == "spot" and cfg.k8s_platform == "gke" and applies(cfg, spec):
        return [{"key": GKE_SPOT, "operator": "Equal", "value": "true",
                 "effect": "NoSchedule"}]
    return []


# --- Vertex AI ----------------------------------------------------------------------------
def vertex_scheduling(cfg: RunConfig, spec) -> dict:
    """Scheduling fields (proto-plus dict) for the capacity; {} for on_demand/reservation and
    for a step the capacity does not apply to."""
    strategy = VERTEX_STRATEGY.get(cfg.capacity)
    if strategy is None or not applies(cfg, spec):
        return {}
    out = {"strategy": strategy}
    if cfg.capacity == "flex_start":
        # Scheduling.max_wait_duration: how long a FLEX_START job waits for its machines
        # (0 waits forever; the default 24 h); the step's own patience bounds it.
        out["max_wait_duration"] = dt.timedelta(seconds=cfg.schedule_timeout_seconds)
    return out


def vertex_reservation_affinity(cfg: RunConfig, spec) -> dict | None:
    if cfg.capacity != "reservation" or not applies(cfg, spec):
        return None
    return {"reservation_affinity_type": "SPECIFIC_RESERVATION",
            "key": VERTEX_RESERVATION_KEY, "values": [cfg.reservation]}


# --- Cloud TPU queued resources -------------------------------------------------------------
def tpu_reservation_name(cfg: RunConfig, project: str) -> str:
    if TPU_RESERVATION.match(cfg.reservation):
        return cfg.reservation
    return f"projects/{project}/locations/{cfg.tpu_zone}/reservations/{cfg.reservation}"


def describe(cfg: RunConfig) -> str:
    """One line for the dry run and the logs."""
    if cfg.capacity == "reservation":
        return f"capacity reservation ({cfg.reservation})"
    return f"capacity {cfg.capacity}"
