"""The Vertex AI part of preflight (tasks/provision/preflight.py): the project and region
answer, and the caller may act as the job's service account; on the workers' side, the job's
service account may use the buckets (its bindings in their IAM policies), the image exists
(tasks/provision/image_registry.py) and the region's GPU quota holds one step's GPUs."""
from __future__ import annotations

from tasks.config import RunConfig
from tasks.errors import BertflowError
from tasks.provision import image_registry, quota, worker_identity
from tasks.provision.capacity import applies
from tasks.provision.preflight import DOCS, Check, act_as, api_message, not_checked
from tasks.provision.spec import distributed_spec
from tasks.runs.runlayout import RunContext
from tasks.provision.vertex_ai.client import job_client, parent, resolve_project

# Vertex AI, "Use a custom service account": Vertex AI pulls the image with its own service
# agent, never with the job's service account.
PULLER = ("the Vertex AI Service Agent (service-PROJECT_NUMBER@gcp-sa-aiplatform.iam."
          "gserviceaccount.com)")


def checks(cfg: RunConfig, ctx: RunContext, backend) -> list[Check]:
    """`backend`: the VertexAIBackend, whose rendering of the train step's CustomJob (as
    the dry run prints it) names the image and the GPUs."""
    from google.api_core import exceptions

    try:
        project = resolve_project(cfg)
        location = parent(cfg, project)
        client = job_client(cfg)
    except BertflowError as err:
        return [Check("vertex_ai", "project and region", False, f"Vertex AI: {err}")]
    except Exception as err:  # noqa: BLE001 (google.auth's DefaultCredentialsError)
        return [Check("vertex_ai", "credentials", False, (
            f"Vertex AI: no credentials ({type(err).__name__}: {str(err)[:200]}); set "
            f"gcp_conn_id or configure application-default credentials"))]
    found = []
    what = f"list CustomJobs in {location}"
    try:
        client.list_custom_jobs(request={"parent": location, "page_size": 1})
        found.append(Check("vertex_ai", what, True))
    except (exceptions.PermissionDenied, exceptions.Forbidden) as err:
        # roles/aiplatform.user (Vertex AI access control: "Vertex AI User").
        found.append(Check("vertex_ai", what, False, (
            f"Vertex AI: cannot list custom jobs in {location}: {api_message(err)} (grant "
            f"the caller roles/aiplatform.user on project {project}, which holds "
            f"aiplatform.customJobs.create/get/list/cancel; and enable "
            f"aiplatform.googleapis.com; {DOCS})")))
    except exceptions.GoogleAPICallError as err:
        found.append(Check("vertex_ai", what, False, (
            f"Vertex AI: project {project} in region {cfg.gcp_region} does not answer: "
            f"{api_message(err)} (check gcp_project and gcp_region, and that the Vertex AI "
            f"API aiplatform.googleapis.com is enabled in the project)")))
    except Exception as err:  # noqa: BLE001 (credentials refused, no network)
        found.append(Check("vertex_ai", what, False, (
            f"Vertex AI: cannot reach {location}: {type(err).__name__}: {str(err)[:200]}")))
    if cfg.service_account:
        found.append(act_as(cfg, cfg.service_account))
    else:
        found.append(Check("vertex_ai", "service account", True,
                            "no service_account: jobs run as Vertex AI's custom code service "
                            "agent, which needs no actAs"))
    spec = distributed_spec(cfg, "train", ctx.run_uri)
    [job] = backend.render(cfg, ctx, spec)
    pools = [p for p in job["jobSpec"]["workerPoolSpecs"] if p]
    images = {p["containerSpec"]["imageUri"] for p in pools}
    found += worker_identity.service_account_checks(cfg)
    found += image_registry.checks(cfg, {i: "every step" for i in images}, PULLER)
    found.append(gpu_quota(cfg, spec, project, pools))
    return found


def gpu_quota(cfg: RunConfig, spec, project: str, pools: list[dict]) -> Check:
    """The train step's GPUs (every accelerated replica; `pools`: its CustomJob's worker
    pools, as the REST API writes them) against the region's quota."""
    kinds = {p["machineSpec"].get("acceleratorType") for p in pools} - {None, ""}
    if not kinds:
        return Check("quota", "no accelerators asked for", True)
    kind = kinds.pop()
    needed = sum(int(p["machineSpec"].get("acceleratorCount", 0)) * int(p["replicaCount"])
                 for p in pools)
    what = f"{needed} x {kind} in {cfg.gcp_region}"
    metric = quota.vertex_metric(kind, cfg.capacity == "spot" and applies(cfg, spec))
    if metric is None:
        return not_checked("quota", what, f"no Vertex AI custom training quota metric is "
                                          f"named here for {kind}; see the console's Quotas "
                                          f"page for {quota.VERTEX}")
    return quota.region_check(cfg, project, quota.VERTEX, metric, cfg.gcp_region, needed,
                              what, "num_workers or devices_per_worker")
