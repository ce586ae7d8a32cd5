"""GPU quota for a GKE cluster's GPU node pools: Compute Engine's regional quota of the GPU
the train step's pods select, against the GPUs all its pods ask for at once
(tasks/provision/quota.py's compute_check, `regions.get`).

The run's config names neither the cluster's project nor its region, so both are read off a
node: its `spec.providerID`, `gce://PROJECT/ZONE/INSTANCE` on GKE (the GCE cloud provider's
format, kubernetes/cloud-provider-gcp). Without a readable node, or off GKE, quota is "not
checked".
"""
from __future__ import annotations

from tasks.config import RunConfig
from tasks.provision import quota
from tasks.provision.capacity import GKE_SPOT
from tasks.provision.kubernetes.render import GKE_ACCELERATOR, GPU_RESOURCE
from tasks.provision.preflight import Check, not_checked

# GKE's accelerator label values (GKE, "Run GPUs in GKE Standard node pools",
# https://cloud.google.com/kubernetes-engine/docs/how-to/gpus: node label cloud.google.com/
# gke-accelerator, "Value: The type of GPU accelerator that you use. For example,
# nvidia-tesla-t4"; its accelerator types include nvidia-l4, nvidia-tesla-a100,
# nvidia-a100-80gb, nvidia-h100-80gb, nvidia-tesla-p100) -> Compute Engine's regional quota
# metric of that GPU (Compute Engine API, Quota.Metric: NVIDIA_T4_GPUS, ...; spot and
# preemptible VMs use PREEMPTIBLE_ + the same).
GPU_METRICS = {
    "nvidia-tesla-t4": "NVIDIA_T4_GPUS", "nvidia-l4": "NVIDIA_L4_GPUS",
    "nvidia-tesla-v100": "NVIDIA_V100_GPUS", "nvidia-tesla-p100": "NVIDIA_P100_GPUS",
    "nvidia-tesla-p4": "NVIDIA_P4_GPUS", "nvidia-tesla-a100": "NVIDIA_A100_GPUS",
    "nvidia-a100-80gb": "NVIDIA_A100_80GB_GPUS", "nvidia-h100-80gb": "NVIDIA_H100_GPUS",
}
WHAT = "GPU quota of the cluster's region"


def check(cfg: RunConfig, core, jobs: list[tuple[str, dict]]) -> Check:
    """`jobs`: (step, Job spec) of the run, as rendered; `core`: a CoreV1Api."""
    train = [(spec, spec["template"]["spec"]) for step, spec in jobs if step == "train"]
    gpus = [(spec["completions"], pod) for spec, pod in train
            if GPU_RESOURCE in pod["containers"][0].get("resources", {}).get("limits", {})]
    if not gpus:
        return Check(quota.AREA, "no GPUs asked for", True)
    labels = {pod.get("nodeSelector", {}).get(GKE_ACCELERATOR) for _, pod in gpus}
    spot = any(pod.get("nodeSelector", {}).get(GKE_SPOT) == "true" for _, pod in gpus)
    needed = sum(count * int(pod["containers"][0]["resources"]["limits"][GPU_RESOURCE])
                 for count, pod in gpus)
    label = labels.pop() if len(labels) == 1 else None
    if cfg.k8s_platform != "gke" or label not in GPU_METRICS:
        return not_checked(quota.AREA, WHAT, (
            f"{'off GKE' if cfg.k8s_platform != 'gke' else f'GPU type {label}'}: preflight "
            f"names no quota metric for it; the cluster autoscaler reports a quota it hits on "
            f"the pending pods"))
    metric = ("PREEMPTIBLE_" if spot else "") + GPU_METRICS[label]
    where = _project_and_region(core)
    if isinstance(where, str):
        return not_checked(quota.AREA, WHAT, where)
    project, region = where
    return quota.compute_check(cfg, project, metric, region, needed,
                               f"{needed} x {label} in {region}",
                               "num_workers or devices_per_worker")


def _project_and_region(core) -> tuple[str, str] | str:
    """(project, region) from a node's providerID, or why not."""
    from kubernetes.client import ApiException

    try:
        nodes = core.list_node(limit=1).items
    except ApiException as err:
        return (f"the cluster's project and region come from a node, and the caller may not "
                f"list nodes ({err.status} {err.reason})")
    provider = (nodes[0].spec.provider_id or "") if nodes else ""
    if not provider.startswith("gce://") or provider.count("/") != 4:
        return "no node names its project and zone (a gce:// providerID)"
    project, zone = provider[len("gce://"):].split("/")[:2]
    return project, zone.rsplit("-", 1)[0]
