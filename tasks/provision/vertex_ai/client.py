"""The Vertex AI JobService client (google-cloud-aiplatform's aiplatform_v1) and where jobs
live: the project and the region's parent. `BERTFLOW_VERTEX_ENDPOINT=http://HOST:PORT` points
the client (REST, anonymous) at a test fake."""
from __future__ import annotations

import os

from tasks.config import RunConfig
from tasks.errors import ConfigError

ENDPOINT_ENV = "BERTFLOW_VERTEX_ENDPOINT"


def job_client(cfg: RunConfig):
    """A JobServiceClient for cfg.gcp_region (or the BERTFLOW_VERTEX_ENDPOINT override)."""
    from google.cloud import aiplatform_v1

    endpoint = os.environ.get(ENDPOINT_ENV)
    if endpoint:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud.aiplatform_v1.services.job_service.transports.rest import (
            JobServiceRestTransport)

        scheme, _, host = endpoint.rpartition("://")
        return aiplatform_v1.JobServiceClient(transport=JobServiceRestTransport(
            host=host, credentials=AnonymousCredentials(), url_scheme=scheme or "https"))
    credentials = None
    if cfg.gcp_conn_id:
        from tasks.io.cloud_storage import google_connection

        credentials = google_connection(cfg.gcp_conn_id)[0]
    return aiplatform_v1.JobServiceClient(
        credentials=credentials,
        client_options={"api_endpoint": f"{cfg.gcp_region}-aiplatform.googleapis.com"})


def resolve_project(cfg: RunConfig) -> str:
    """gcp_project, else the gcp_conn_id connection's project, else the ambient default."""
    if cfg.gcp_project:
        return cfg.gcp_project
    if cfg.gcp_conn_id:
        from tasks.io.cloud_storage import google_connection

        project = google_connection(cfg.gcp_conn_id)[1]
        if project:
            return project
    if not os.environ.get(ENDPOINT_ENV):
        try:
            import google.auth

            project = google.auth.default()[1]
        except Exception:  # google.auth.exceptions.DefaultCredentialsError
            project = None
        if project:
            return project
    raise ConfigError("gcp_project", "no Google Cloud project for the Vertex AI job: set "
                                     "gcp_project, a project in the gcp_conn_id connection, "
                                     "or an ambient default project")


def parent(cfg: RunConfig, project: str) -> str:
    if not cfg.gcp_region:
        raise ConfigError("gcp_region", "vertex_ai needs a region, e.g. us-central1")
    return f"projects/{project}/locations/{cfg.gcp_region}"
