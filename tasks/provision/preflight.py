"""`python -m tasks preflight --run-dir URI`: check, with the credentials the run will use and
without spending money, that the run may do what its backend will ask of the platforms.

- Buckets: write, read back and delete a probe object under the run folder (and under
  `export_uri`), through tasks.io.storage and the run's connections.
- the backend's own checks, in its folder (Backend.preflight_checks):
  - kubernetes/preflight.py: a SelfSubjectAccessReview (authorization.k8s.io/v1) for every
    verb and resource the backend calls;
  - vertex_ai/preflight.py: the project and region answer (one page of CustomJobs), the job's
    service account exists and the caller may act as it (`act_as` here: IAM
    testIamPermissions with `iam.serviceAccounts.actAs`, over the IAM REST API with
    google-auth's session);
  - tpu_vm/preflight.py: the zone offers the accelerator type and the runtime version (Cloud
    TPU lists both).
  This module imports none of them: the shared probes and the result live here.
- the workers' side, read from the caller's side, in each backend's part: the workers'
  identity on the buckets (bucket_access.py, worker_identity.py,
  kubernetes/cluster_preflight.py), the images (image_registry.py), the namespace,
  ServiceAccount and nodes (kubernetes/cluster_preflight.py), GPU quota (quota.py).

Every failure names what is missing and the role or permission that grants it; all are
collected into one PreflightError (the CLI exits 2). What the caller cannot see is a check
with `checked=False` ("not checked: why"), which fails nothing. The result is written to
`{run}/provision/preflight.json`. `provision` runs it first on every non-local run.

`BERTFLOW_IAM_ENDPOINT=http://HOST:PORT` points the IAM calls at a test fake (anonymous);
never set it in production.
"""
from __future__ import annotations

import datetime as dt
import re
import uuid
from dataclasses import asdict, dataclass

from tasks.config import RunConfig

from tasks.io.uris import join_uri
from tasks.errors import BertflowError, StorageError
from tasks.io import storage
from tasks.provision import google_rest
from tasks.runs.runlayout import RunContext

DOCS = "docs/deployment-iam.md"
IAM_ENDPOINT_ENV = "BERTFLOW_IAM_ENDPOINT"
IAM_ENDPOINT = "https://iam.googleapis.com"
ACT_AS = "iam.serviceAccounts.actAs"
# The one Cloud Storage role of the docs and the messages: object create, get, list and
# delete, and no bucket or IAM administration (Cloud Storage, "IAM roles for Cloud Storage":
# Storage Object User, https://cloud.google.com/storage/docs/access-control/iam-roles).
# objectAdmin would add object ACL and IAM changes nobody here needs.
OBJECT_ROLE = "roles/storage.objectUser"


class PreflightError(BertflowError):
    """Every failed check, one per line."""

    def __init__(self, failures: list[str], result: dict | None = None):
        self.failures = failures
        self.result = result or {"checks": []}
        super().__init__(f"preflight found {len(failures)} problem(s):\n" +
                         "\n".join(f"- {f}" for f in failures))


@dataclass
class Check:
    area: str  # storage, workers, kubernetes, vertex_ai, tpu_vm, image, quota
    what: str
    ok: bool
    message: str = ""
    # False: the caller cannot see this from its side (message: why). It does not fail the
    # run; the summary prints it as "not checked", so nothing passes silently.
    checked: bool = True


def not_checked(area: str, what: str, why: str) -> Check:
    return Check(area, what, True, f"not checked: {why}", checked=False)


def result_uri(ctx: RunContext) -> str:
    return join_uri(ctx.step_uri("provision"), "preflight.json")


def run(cfg: RunConfig, ctx: RunContext, backend) -> dict:
    """Run the shared checks and those of `backend` (the run's Backend: its
    `preflight_checks`, in its own folder, e.g. tasks/provision/kubernetes/preflight.py); write
    and return the result. Raises PreflightError naming every failure."""
    checks = storage_checks(cfg, ctx) + backend.preflight_checks(cfg, ctx)
    failures = [c.message for c in checks if not c.ok]
    result = {"ok": not failures, "backend": cfg.provisioner,
              "checked_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "checks": [asdict(c) for c in checks], "failures": failures}
    try:
        storage.write_json(result_uri(ctx), result)
    except StorageError:
        pass  # the storage check already says why
    if failures:
        raise PreflightError(failures, result)
    return result


def summary(result: dict) -> str:
    """One line per check, as the CLI prints them; a check the caller cannot make says why."""
    lines = []
    for c in result["checks"]:
        if not c.get("checked", True):
            lines.append(f"n/a  {c['area']}: {c['what']}: {c['message']}")
        else:
            lines.append(f"{'ok  ' if c['ok'] else 'FAIL'} {c['area']}: {c['what']}")
    return "\n".join(lines)


def counts(result: dict) -> str:
    """"N checks passed" and, when some could not be made, "M not checked"."""
    skipped = sum(not c.get("checked", True) for c in result["checks"])
    passed = len(result["checks"]) - skipped
    return f"{passed} checks passed" + (f", {skipped} not checked" if skipped else "")


# --- buckets --------------------------------------------------------------------------------
def storage_checks(cfg: RunConfig, ctx: RunContext) -> list[Check]:
    places = [("run folder", ctx.step_uri("provision"))]
    if cfg.export_uri and "{" not in cfg.export_uri:
        places.append(("export_uri", cfg.export_uri))
    return [_probe(label, folder, cfg) for label, folder in places]


def _probe(label: str, folder: str, cfg: RunConfig) -> Check:
    uri = join_uri(folder, f".bertflow-preflight-{uuid.uuid4().hex[:12]}")
    text = f"bertflow preflight {uuid.uuid4().hex}\n"
    what = f"write, read and delete {storage.redact(uri)} ({label})"
    step = "write"
    try:
        storage.write_text(uri, text)
        step = "read"
        if storage.read_text(uri) != text:
            return Check("storage", what, False, f"Storage: {storage.redact(uri)} read back "
                                                 "other bytes than were written")
        step = "delete"
        storage.delete_prefix(uri)
        if storage.exists(uri):
            raise StorageError(f"{storage.redact(uri)}: still there after delete (access "
                               "denied?)")
    except StorageError as err:
        return Check("storage", what, False, f"Storage: cannot {step} {storage.redact(uri)} "
                                             f"({label}): {err} ({_storage_grant(uri, cfg)})")
    return Check("storage", what, True)


def _storage_grant(uri: str, cfg: RunConfig) -> str:
    scheme = storage.scheme_of(uri)
    bucket = uri.split("://", 1)[1].split("/", 1)[0] if "://" in uri else ""
    if scheme == "gs":
        who = f"connection {cfg.gcp_conn_id}" if cfg.gcp_conn_id else "the ambient account"
        return (f"grant {who} {OBJECT_ROLE} on bucket {bucket}, and the workers' identity "
                f"too; {DOCS}")
    if scheme == "s3":
        who = f"connection {cfg.aws_conn_id}" if cfg.aws_conn_id else "the ambient identity"
        return (f"allow {who} s3:ListBucket on arn:aws:s3:::{bucket} and s3:PutObject, "
                f"s3:GetObject, s3:DeleteObject on arn:aws:s3:::{bucket}/*; {DOCS}")
    return "check that the folder exists and this user may write to it"


def act_as(cfg: RunConfig, account: str) -> Check:
    """IAM projects.serviceAccounts.testIamPermissions: 404 when the account does not exist,
    else the subset of the asked permissions the caller holds."""
    what = f"act as service account {account}"
    # iam.googleapis.com/v1/{resource=projects/*/serviceAccounts/*}:testIamPermissions; "-"
    # for the project: IAM finds the account by its email (IAM REST reference).
    resource = f"projects/-/serviceAccounts/{account}"
    # roles/iam.serviceAccountUser holds actAs (Vertex AI: "Use a custom service account").
    grant = (f"grant the caller roles/iam.serviceAccountUser on the service account "
             f"{account} (it holds {ACT_AS}); {DOCS}")
    try:
        session, base = google_rest.session(cfg, IAM_ENDPOINT_ENV, IAM_ENDPOINT)
        resp = session.post(f"{base}/v1/{resource}:testIamPermissions",
                            json={"permissions": [ACT_AS]}, timeout=30)
    except Exception as err:  # noqa: BLE001 (no credentials, unreachable)
        return Check("vertex_ai", what, False, f"Vertex AI: cannot ask IAM about {account}: "
                                               f"{str(err).splitlines()[0][:200]}")
    if resp.status_code == 404:
        return Check("vertex_ai", what, False, (
            f"Vertex AI: service account {account} does not exist (check service_account, "
            f"or create it: gcloud iam service-accounts create)"))
    if resp.status_code != 200:
        return Check("vertex_ai", what, False, (
            f"Vertex AI: IAM refused to test {ACT_AS} on {account}: {resp.status_code} "
            f"{google_rest.message(resp)} ({grant})"))
    if ACT_AS not in (resp.json().get("permissions") or []):
        return Check("vertex_ai", what, False,
                     f"Vertex AI: the caller may not act as {account}, which runs the "
                     f"job's workers ({grant})")
    return Check("vertex_ai", what, True)


def api_message(err) -> str:
    """A Google API error's own message, without the REST transport's "GET <url>: "."""
    return re.sub(r"^(GET|POST|PUT|PATCH|DELETE) \S+: ", "", err.message or str(err))
