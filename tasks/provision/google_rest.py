"""An authorized session for the Google REST APIs preflight calls without a client library in
the lock (IAM, Cloud Quotas): the run's `gcp_conn_id` key, else application-default
credentials. A test points an API at a fake with its `BERTFLOW_*_ENDPOINT` variable
(`http://HOST:PORT`), and the session is then anonymous; never set those in production."""
from __future__ import annotations

import os

from tasks.config import RunConfig

SCOPE = "https://www.googleapis.com/auth/cloud-platform"


def session(cfg: RunConfig, endpoint_env: str, endpoint: str):
    """(requests-like session, base URL without a trailing slash)."""
    import requests

    override = os.environ.get(endpoint_env)
    if override:  # a test fake: anonymous
        return requests.Session(), override.rstrip("/")
    from google.auth.transport.requests import AuthorizedSession

    return AuthorizedSession(credentials(cfg)), endpoint


def credentials(cfg: RunConfig):
    """The key of connection `gcp_conn_id`, else application-default credentials (raises
    google.auth's DefaultCredentialsError without either)."""
    found = None
    if cfg.gcp_conn_id:
        from tasks.io.cloud_storage import google_connection

        found = google_connection(cfg.gcp_conn_id)[0]
    if found is None:
        import google.auth

        found = google.auth.default(scopes=[SCOPE])[0]
    return found


def message(resp) -> str:
    """A Google REST error's own message."""
    try:
        return resp.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return resp.text[:200]
