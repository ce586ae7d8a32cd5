"""`python -m tasks preflight --run-dir URI`: check, with the credentials the run will use and
without spending money, that the run may do what its backend will ask of the platforms.

- Buckets: write, read back and delete a probe object under the run folder (and under
  `export_uri`), through tasks.io.storage and the run's connections.
- kubernetes: a SelfSubjectAccessReview (authorization.k8s.io/v1) for every verb and
  resource the backend calls (ACCESS, read from tasks/provision/kubernetes/backend.py).
- vertex_ai: the project and region answer (one page of CustomJobs), the job's service
  account exists and the caller may act as it (IAM testIamPermissions with
  `iam.serviceAccounts.actAs`, over the IAM REST API with google-auth's session).
- tpu_vm: the zone offers the accelerator type and the runtime version (Cloud TPU lists both).

Every failure names what is missing and the role or permission that grants it; all are
collected into one PreflightError (the CLI exits 2). The result is written to
`{run}/provision/preflight.json`. `provision` runs it first on every non-local run.

`BERTFLOW_IAM_ENDPOINT=http://HOST:PORT` points the IAM calls at a test fake (anonymous);
never set it in production.
"""
from __future__ import annotations

import datetime as dt
import os
import re
import uuid
from dataclasses import asdict, dataclass

from tasks.config import RunConfig

from tasks.io.uris import join_uri
from tasks.errors import BertflowError, StorageError
from tasks.io import storage
from tasks.runs.runlayout import RunContext

DOCS = "docs/deployment-iam.md"
IAM_ENDPOINT_ENV = "BERTFLOW_IAM_ENDPOINT"
IAM_ENDPOINT = "https://iam.googleapis.com"
ACT_AS = "iam.serviceAccounts.actAs"
# (apiGroup, resource, subresource, verbs): every call tasks/provision/kubernetes/backend.py makes
# (create/list/delete of Jobs, Services and Secrets; list/get/delete of pods; their logs).
ACCESS = (
    ("batch", "jobs", "", ("create", "list", "delete")),
    ("", "services", "", ("create", "list", "delete")),
    ("", "secrets", "", ("create", "list", "delete")),
    ("", "pods", "", ("get", "list", "delete")),
    ("", "pods", "log", ("get",)),
)


class PreflightError(BertflowError):
    """Every failed check, one per line."""

    def __init__(self, failures: list[str], result: dict | None = None):
        self.failures = failures
        self.result = result or {"checks": []}
        super().__init__(f"preflight found {len(failures)} problem(s):\n" +
                         "\n".join(f"- {f}" for f in failures))


@dataclass
class Check:
    area: str  # storage, kubernetes, vertex_ai, tpu_vm
    what: str
    ok: bool
    message: str = ""


def result_uri(ctx: RunContext) -> str:
    return join_uri(ctx.step_uri("provision"), "preflight.json")


def run(cfg: RunConfig, ctx: RunContext, backend=None) -> dict:
    """Run every check for cfg.provisioner (`backend`: the Backend the run uses, for its
    clients); write and return the result. Raises PreflightError naming every failure."""
    checks = storage_checks(cfg, ctx)
    if cfg.provisioner == "kubernetes":
        checks += kubernetes_checks(cfg, ctx, backend)
    elif cfg.provisioner == "vertex_ai":
        checks += vertex_checks(cfg, ctx)
    elif cfg.provisioner == "tpu_vm":
        checks += tpu_checks(cfg, ctx)
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
    """One line per check, as the CLI prints them."""
    return "\n".join(f"{'ok  ' if c['ok'] else 'FAIL'} {c['area']}: {c['what']}"
                     for c in result["checks"])


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
    if scheme == "gs":  # roles/storage.objectAdmin: objects create/get/list/delete (GCS IAM)
        who = f"connection {cfg.gcp_conn_id}" if cfg.gcp_conn_id else "the ambient account"
        return (f"grant {who} roles/storage.objectAdmin on bucket {bucket}, and the workers' "
                f"service account too; {DOCS}")
    if scheme == "s3":
        who = f"connection {cfg.aws_conn_id}" if cfg.aws_conn_id else "the ambient identity"
        return (f"allow {who} s3:ListBucket on arn:aws:s3:::{bucket} and s3:PutObject, "
                f"s3:GetObject, s3:DeleteObject on arn:aws:s3:::{bucket}/*; {DOCS}")
    return "check that the folder exists and this user may write to it"


# --- Kubernetes -----------------------------------------------------------------------------
def kubernetes_checks(cfg: RunConfig, ctx: RunContext, backend=None) -> list[Check]:
    from kubernetes import client

    from tasks.provision.kubernetes.backend import KubernetesBackend

    backend = backend or KubernetesBackend()
    ns = cfg.k8s_namespace
    who = (f"the identity of connection {cfg.k8s_conn_id}" if cfg.k8s_conn_id
           else "the in-cluster service account or your kubeconfig user")
    try:
        api = client.AuthorizationV1Api(backend.api(cfg).core.api_client)
    except Exception as err:  # noqa: BLE001 (no kubeconfig, a bad connection)
        return [Check("kubernetes", "reach the API server", False,
                      f"Kubernetes: no client for the cluster: {str(err).splitlines()[0]} "
                      f"(set k8s_conn_id, or run where a kubeconfig or in-cluster service "
                      f"account exists)")]
    checks = []
    for group, resource, sub, verbs in ACCESS:
        name = f"{resource}/{sub}" if sub else resource
        full = f"{name}.{group}" if group else name
        denied = []
        for verb in verbs:
            review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=client.V1ResourceAttributes(
                    namespace=ns, verb=verb, group=group, resource=resource,
                    subresource=sub or None)))
            try:
                status = api.create_self_subject_access_review(review).status
            except client.ApiException as err:
                return checks + [Check(
                    "kubernetes", "SelfSubjectAccessReview", False,
                    f"Kubernetes: cannot ask the API server what {who} may do "
                    f"({err.status} {err.reason}); every authenticated user may create "
                    f"selfsubjectaccessreviews.authorization.k8s.io unless the cluster "
                    f"removed that; {DOCS}")]
            except Exception as err:  # noqa: BLE001 (unreachable server)
                return checks + [Check("kubernetes", "reach the API server", False,
                                       f"Kubernetes: the API server does not answer: "
                                       f"{str(err).splitlines()[0][:200]}")]
            if not status.allowed:
                denied.append(verb)
        what = f"{', '.join(verbs)} {full} in namespace {ns}"
        if denied:
            group_text = group or '"" (core)'
            checks.append(Check("kubernetes", what, False, (
                f"Kubernetes: cannot {', '.join(denied)} {full} in namespace {ns} (grant "
                f"{who} a Role with verbs [{', '.join(denied)}] on {name} in apiGroup "
                f"{group_text}; {DOCS})")))
        else:
            checks.append(Check("kubernetes", what, True))
    return checks


# --- Vertex AI --------------------------------------------------------------------------------
def vertex_checks(cfg: RunConfig, ctx: RunContext) -> list[Check]:
    from google.api_core import exceptions

    from tasks.provision.vertex_ai import backend as vertex_ai

    try:
        project = vertex_ai.resolve_project(cfg)
        location = vertex_ai.parent(cfg, project)
        client = vertex_ai.job_client(cfg)
    except BertflowError as err:
        return [Check("vertex_ai", "project and region", False, f"Vertex AI: {err}")]
    except Exception as err:  # noqa: BLE001 (google.auth's DefaultCredentialsError)
        return [Check("vertex_ai", "credentials", False, (
            f"Vertex AI: no credentials ({type(err).__name__}: {str(err)[:200]}); set "
            f"gcp_conn_id or configure application-default credentials"))]
    checks = []
    what = f"list CustomJobs in {location}"
    try:
        client.list_custom_jobs(request={"parent": location, "page_size": 1})
        checks.append(Check("vertex_ai", what, True))
    except (exceptions.PermissionDenied, exceptions.Forbidden) as err:
        # roles/aiplatform.user (Vertex AI access control: "Vertex AI User").
        checks.append(Check("vertex_ai", what, False, (
            f"Vertex AI: cannot list custom jobs in {location}: {_api_message(err)} (grant "
            f"the caller roles/aiplatform.user on project {project}, which holds "
            f"aiplatform.customJobs.create/get/list/cancel; and enable "
            f"aiplatform.googleapis.com; {DOCS})")))
    except exceptions.GoogleAPICallError as err:
        checks.append(Check("vertex_ai", what, False, (
            f"Vertex AI: project {project} in region {cfg.gcp_region} does not answer: "
            f"{_api_message(err)} (check gcp_project and gcp_region, and that the Vertex AI "
            f"API aiplatform.googleapis.com is enabled in the project)")))
    except Exception as err:  # noqa: BLE001 (credentials refused, no network)
        checks.append(Check("vertex_ai", what, False, (
            f"Vertex AI: cannot reach {location}: {type(err).__name__}: {str(err)[:200]}")))
    if cfg.service_account:
        checks.append(_act_as(cfg, cfg.service_account))
    else:
        checks.append(Check("vertex_ai", "service account", True,
                            "no service_account: jobs run as Vertex AI's custom code service "
                            "agent, which needs no actAs"))
    return checks


def _act_as(cfg: RunConfig, account: str) -> Check:
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
        session, base = _iam_session(cfg)
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
            f"{_google_message(resp)} ({grant})"))
    if ACT_AS not in (resp.json().get("permissions") or []):
        return Check("vertex_ai", what, False,
                     f"Vertex AI: the caller may not act as {account}, which runs the "
                     f"job's workers ({grant})")
    return Check("vertex_ai", what, True)


def _iam_session(cfg: RunConfig):
    import requests

    endpoint = os.environ.get(IAM_ENDPOINT_ENV)
    if endpoint:  # a test fake: anonymous
        return requests.Session(), endpoint.rstrip("/")
    from google.auth.transport.requests import AuthorizedSession

    credentials = None
    if cfg.gcp_conn_id:
        from tasks.io.cloud_storage import google_connection

        credentials = google_connection(cfg.gcp_conn_id)[0]
    if credentials is None:
        import google.auth

        credentials = google.auth.default(
            scopes=["https://www.googleapis.com/auth/cloud-platform"])[0]
    return AuthorizedSession(credentials), IAM_ENDPOINT


def _api_message(err) -> str:
    """A Google API error's own message, without the REST transport's "GET <url>: "."""
    return re.sub(r"^(GET|POST|PUT|PATCH|DELETE) \S+: ", "", err.message or str(err))


def _google_message(resp) -> str:
    try:
        return resp.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return resp.text[:200]


# --- Cloud TPU --------------------------------------------------------------------------------
def tpu_checks(cfg: RunConfig, ctx: RunContext) -> list[Check]:
    from google.api_core import exceptions

    from tasks.provision.tpu_vm import backend as tpu_vm

    try:
        client, found = tpu_vm.tpu_client(cfg)
        project = tpu_vm._project(cfg, found)
        version = tpu_vm.runtime_version(cfg)
    except BertflowError as err:
        return [Check("tpu_vm", "project and zone", False, f"Cloud TPU: {err}")]
    parent = f"projects/{project}/locations/{cfg.tpu_zone}"
    checks = []
    for what, wanted, lister, field, knob in (
            ("accelerator type", cfg.accelerator_type, client.list_accelerator_types, "type_",
             "accelerator_type"),
            ("runtime version", version, client.list_runtime_versions, "version",
             "tpu_runtime_version")):
        label = f"{cfg.tpu_zone} offers {what} {wanted}"
        try:
            offered = sorted({getattr(item, field) for item in lister(parent=parent)})
        except (exceptions.PermissionDenied, exceptions.Forbidden) as err:
            # roles/tpu.admin holds tpu.* (IAM "Cloud TPU roles and permissions").
            checks.append(Check("tpu_vm", label, False, (
                f"Cloud TPU: cannot list {what}s in {parent}: {_api_message(err)} (grant "
                f"the caller roles/tpu.admin on project {project}, which holds "
                f"tpu.acceleratortypes.list, tpu.runtimeversions.list and the queued "
                f"resource and node permissions; and enable tpu.googleapis.com; {DOCS})")))
            continue
        except exceptions.GoogleAPICallError as err:
            checks.append(Check("tpu_vm", label, False, (
                f"Cloud TPU: zone {cfg.tpu_zone} of project {project} does not answer: "
                f"{_api_message(err)} (check tpu_zone and tpu_project, and that "
                f"tpu.googleapis.com is enabled)")))
            continue
        except Exception as err:  # noqa: BLE001 (credentials refused, no network)
            checks.append(Check("tpu_vm", label, False, (
                f"Cloud TPU: cannot reach {parent}: {type(err).__name__}: {str(err)[:200]}")))
            continue
        if wanted in offered:
            checks.append(Check("tpu_vm", label, True))
        else:
            near = [o for o in offered if o.startswith(wanted.rsplit("-", 1)[0])] or offered
            checks.append(Check("tpu_vm", label, False, (
                f"Cloud TPU: zone {cfg.tpu_zone} does not offer {what} {wanted} (set {knob} "
                f"to one it offers, e.g. {', '.join(near[:8]) or 'none listed'}; or pick "
                f"another tpu_zone)")))
    return checks


