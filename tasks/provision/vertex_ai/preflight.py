"""The Vertex AI part of preflight (tasks/provision/preflight.py): the project and region
answer, and the caller may act as the job's service account."""
from __future__ import annotations

from tasks.config import RunConfig
from tasks.errors import BertflowError
from tasks.provision.preflight import DOCS, Check, act_as, api_message
from tasks.runs.runlayout import RunContext
from tasks.provision.vertex_ai.client import job_client, parent, resolve_project


def checks(cfg: RunConfig, ctx: RunContext) -> list[Check]:
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
    return found
