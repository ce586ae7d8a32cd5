"""A Google service account's own Cloud Storage permissions on a bucket, asked as the account,
where the caller may impersonate it: IAM Service Account Credentials API
`projects.serviceAccounts.generateAccessToken` (a 5-minute token; the caller needs
`iam.serviceAccounts.getAccessToken`, in roles/iam.serviceAccountTokenCreator on the account),
then Cloud Storage `buckets.testIamPermissions` with that token (google-cloud-storage's
`Bucket.test_iam_permissions`), which answers the subset the account holds however it holds
it: on the bucket, the project, the folder or the organization. Nothing is written.

`BERTFLOW_IAM_CREDENTIALS_ENDPOINT=http://HOST:PORT` points the token call at a test fake.
"""
from __future__ import annotations

from tasks.config import RunConfig
from tasks.provision import google_rest

ENDPOINT_ENV = "BERTFLOW_IAM_CREDENTIALS_ENDPOINT"
ENDPOINT = "https://iamcredentials.googleapis.com"


def lacking(cfg: RunConfig, account: str, bucket: str, need: set[str]) -> list[str] | None:
    """The permissions of `need` the account lacks on `bucket` ([] when it holds them all),
    or None when the caller may not impersonate it (or either call fails)."""
    token = _token(cfg, account)
    if token is None:
        return None
    from google.api_core import exceptions
    from google.cloud import storage as gcs
    from google.oauth2.credentials import Credentials

    try:
        client = gcs.Client(project="-", credentials=Credentials(token))
        held = set(client.bucket(bucket).test_iam_permissions(sorted(need)))
    except exceptions.GoogleAPICallError:
        return None
    return sorted(need - held)


def _token(cfg: RunConfig, account: str) -> str | None:
    try:
        session, base = google_rest.session(cfg, ENDPOINT_ENV, ENDPOINT)
        resp = session.post(f"{base}/v1/projects/-/serviceAccounts/{account}:"
                            f"generateAccessToken",
                            json={"scope": [google_rest.SCOPE], "lifetime": "300s"},
                            timeout=30)
    except Exception:  # noqa: BLE001 (no credentials, unreachable): the policy decides
        return None
    if resp.status_code != 200:
        return None
    return resp.json().get("accessToken")
