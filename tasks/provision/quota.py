"""Is the project's accelerator quota in the region at least what one step asks for?

Vertex AI: read with the Cloud Quotas API (cloudquotas.googleapis.com v1, REST:
`GET projects/{project}/locations/global/services/{service}/quotaInfos`, Cloud Quotas API
reference, "QuotaInfo"), which gives each quota's value per region or zone
(`dimensionsInfos[].dimensions.region` and `.details.value`; -1 is unlimited) but not its
usage: other jobs of the project in the region share the quota, so a limit at least as big as
the request passes with that said. The caller needs `cloudquotas.quotas.get` (roles/
cloudquotas.viewer) and the API enabled; without them the check is "not checked".

Vertex AI GPUs: Vertex AI's custom training metrics (aiplatform.googleapis.com/
custom_model_training_nvidia_t4_gpus, ...), matched against QuotaInfo's `metric`, which names
the service too (its example: compute.googleapis.com/cpus); Spot VMs count against the
`preemptible_` ones. Sources: VERTEX_GPU_METRIC.

GKE node pools: Compute Engine's regional GPU quotas (`regions.get`, `quotas[].metric` such
as NVIDIA_T4_GPUS, PREEMPTIBLE_NVIDIA_T4_GPUS; Compute Engine API reference, Quota.Metric),
which give the usage too (tasks/provision/kubernetes/gpu_quota.py).
"""
from __future__ import annotations

from tasks.config import RunConfig
from tasks.provision import google_rest
from tasks.provision.preflight import Check, not_checked

AREA = "quota"
ENDPOINT_ENV = "BERTFLOW_QUOTAS_ENDPOINT"
ENDPOINT = "https://cloudquotas.googleapis.com"
COMPUTE_ENDPOINT_ENV = "BERTFLOW_COMPUTE_ENDPOINT"
COMPUTE_ENDPOINT = "https://compute.googleapis.com"
VERTEX = "aiplatform.googleapis.com"
# Vertex AI's AcceleratorType -> the GPU's word in its custom training quota metrics. Vertex AI,
# "Schedule training jobs based on resource availability", Quota
# (https://cloud.google.com/vertex-ai/docs/training/schedule-jobs-dws#quota), names
# aiplatform.googleapis.com/custom_model_training_nvidia_h100_gpus and its
# custom_model_training_preemptible_nvidia_h100_gpus; GoogleCloudPlatform/vertex-ai-samples
# (community-content/vertex-distributed-training/a3mega/llama-3-8b-nemo-pretraining/README.md)
# names custom_model_training_nvidia_h100_mega_gpus and, "If using Spot VMs", the preemptible_
# one. No docs table found lists the others; they are the words of Vertex AI's quota errors
# and public code (e.g. ..._nvidia_l4_gpus, GoogleCloudPlatform/stable-diffusion-on-gcp#12).
VERTEX_GPU_METRIC = {
    "NVIDIA_TESLA_T4": "nvidia_t4", "NVIDIA_TESLA_V100": "nvidia_v100",
    "NVIDIA_TESLA_P100": "nvidia_p100", "NVIDIA_TESLA_P4": "nvidia_p4",
    "NVIDIA_TESLA_A100": "nvidia_a100", "NVIDIA_A100_80GB": "nvidia_a100_80gb",
    "NVIDIA_L4": "nvidia_l4", "NVIDIA_H100_80GB": "nvidia_h100",
    "NVIDIA_H100_MEGA_80GB": "nvidia_h100_mega",
}


def vertex_metric(accelerator: str, spot: bool) -> str | None:
    word = VERTEX_GPU_METRIC.get(accelerator)
    if word is None:
        return None
    return f"{VERTEX}/custom_model_training_{'preemptible_' if spot else ''}{word}_gpus"


def region_check(cfg: RunConfig, project: str, service: str, metric: str, region: str,
                 needed: int, what: str, field: str) -> Check:
    """`needed` units of `metric` in `region` against the quota's value there (Cloud
    Quotas)."""
    try:
        value = _value(cfg, project, service, metric, region)
    except _Unseen as why:
        return not_checked(AREA, what, str(why))
    if value is None:
        return not_checked(AREA, what, f"Cloud Quotas lists no {metric} for {region} in "
                                       f"project {project}")
    return verdict(what, project, metric, region, needed, field, value)


def compute_check(cfg: RunConfig, project: str, metric: str, region: str, needed: int,
                  what: str, field: str) -> Check:
    """`needed` units of a Compute Engine regional quota `metric` (e.g. NVIDIA_L4_GPUS):
    Compute Engine API `regions.get`, whose `quotas[]` give each metric's limit and usage
    (the caller needs compute.regions.get, in roles/compute.viewer)."""
    try:
        session, base = google_rest.session(cfg, COMPUTE_ENDPOINT_ENV, COMPUTE_ENDPOINT)
        resp = session.get(f"{base}/compute/v1/projects/{project}/regions/{region}",
                           timeout=30)
    except Exception as err:  # noqa: BLE001 (no credentials, no network)
        return not_checked(AREA, what, f"Compute Engine did not answer: "
                                       f"{type(err).__name__}: {str(err)[:200]}")
    if resp.status_code != 200:
        return not_checked(AREA, what, (
            f"Compute Engine answered {resp.status_code} {google_rest.message(resp)} for "
            f"region {region} of project {project} (the caller needs compute.regions.get, "
            f"e.g. roles/compute.viewer)"))
    for entry in resp.json().get("quotas", []):
        if entry.get("metric") == metric:
            return verdict(what, project, metric, region, needed, field,
                           int(entry.get("limit", 0)), int(entry.get("usage", 0)))
    return not_checked(AREA, what, f"region {region} lists no quota {metric}")


def verdict(what: str, project: str, metric: str, region: str, needed: int, field: str,
            value: int, usage: int | None = None) -> Check:
    """A limit below what one step asks fails; else it passes, saying what is in use."""
    used = ("its usage by other jobs is not visible" if usage is None
            else f"{usage} in use now")
    if value < 0 or value >= needed:
        return Check(AREA, what, True, f"quota {value if value >= 0 else 'unlimited'}; "
                                       f"{used}")
    return Check(AREA, what, False, (
        f"Quota: project {project} may use {value} of {metric} in {region}, and one step "
        f"asks for {needed} (request more: IAM & Admin > Quotas, or set {field} smaller, or "
        f"use a region with quota)"))


class _Unseen(Exception):
    pass


def _value(cfg: RunConfig, project: str, service: str, metric: str,
           region: str) -> int | None:
    try:
        session, base = google_rest.session(cfg, ENDPOINT_ENV, ENDPOINT)
        url = f"{base}/v1/projects/{project}/locations/global/services/{service}/quotaInfos"
        token = ""
        while True:
            resp = session.get(url, params={"pageToken": token} if token else {}, timeout=30)
            if resp.status_code != 200:
                raise _Unseen(f"Cloud Quotas answered {resp.status_code} "
                              f"{google_rest.message(resp)} (the caller needs "
                              f"cloudquotas.quotas.get, e.g. roles/cloudquotas.viewer, and "
                              f"cloudquotas.googleapis.com enabled)")
            body = resp.json()
            for info in body.get("quotaInfos", []):
                if info.get("metric") == metric:
                    return _for_region(info, region)
            token = body.get("nextPageToken", "")
            if not token:
                return None
    except _Unseen:
        raise
    except Exception as err:  # noqa: BLE001 (no credentials, no network)
        raise _Unseen(f"Cloud Quotas did not answer: {type(err).__name__}: "
                      f"{str(err).splitlines()[0][:200] if str(err) else ''}") from None


def _for_region(info: dict, region: str) -> int | None:
    """The value of the dimensions info for `region`, else the one without dimensions (the
    default for every region not named)."""
    default = None
    for entry in info.get("dimensionsInfos", []):
        value = int((entry.get("details") or {}).get("value", 0))
        dimensions = entry.get("dimensions") or {}
        if dimensions.get("region") == region:
            return value
        if not dimensions:
            default = value
    return default
