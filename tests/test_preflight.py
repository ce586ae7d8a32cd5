"""`python -m tasks preflight` and the check `provision` runs first on a real run.

Buckets against the real storage servers on loopback (tests/storage_servers.py), denials
injected below the official clients by tests/fault_proxy.py (as in tests/test_storage.py).
Control planes are fakes on loopback driven by the real clients: the `kubernetes` client's
SelfSubjectAccessReviews against tests/fake_kubernetes.py, google-cloud-aiplatform's
JobServiceClient against tests/fake_vertex.py, the IAM REST API (google-auth's session path)
against tests/fake_iam.py, google-cloud-tpu's TpuClient against tests/fake_tpu.py. Each
backend has a passing case and injected denials whose messages name what is missing and
what grants it.
"""
from __future__ import annotations

import json
import uuid

import pytest

from fake_iam import FakeIam
from fake_kubernetes import FakeKube
from fake_tpu import FakeTpu
from fake_vertex import FakeVertex
from storage_servers import BUCKET, connections, gcs_emulator, root, s3_server  # noqa: F401
from tasks.config import parse_config
from tasks.errors import BertflowError
from tasks.io import storage
from tasks.provision import preflight
from tasks.provision.backends import backend_for
from tasks.provision.kubernetes import preflight as k8s_preflight
from tasks.provision.tpu_vm import client as tpu_client
from tasks.provision.tpu_vm import render as tpu_render
from tasks.provision.vertex_ai import client as vertex_client
from tasks.steps.provision import run as provision_run
from tasks.runs.runlayout import RunContext, init_run
from test_cli import cli
from test_storage import KINDS, proxied  # noqa: F401

DOCS = "docs/deployment-iam.md"
SA = "trainer@proj.iam.gserviceaccount.com"
# A registry nobody serves (port 9, discard): the image checks answer "not checked" at once,
# without the network (tests/test_preflight_workers.py checks images against a fake).
REGISTRY = "127.0.0.1:9/proj/repo"


def context(root: str) -> RunContext:
    return RunContext(root, "bert_finetune", f"manual__{uuid.uuid4().hex[:8]}")


def failures(cfg, ctx) -> list[str]:
    with pytest.raises(preflight.PreflightError) as err:
        preflight.run(cfg, ctx, backend_for(cfg))
    assert str(err.value).startswith(f"preflight found {len(err.value.failures)} problem(s)")
    return err.value.failures


# --- buckets ------------------------------------------------------------------------------------
def test_bucket_probe_passes_and_leaves_only_the_result(root):  # noqa: F811
    cfg = parse_config({"artifact_root": root, "export_uri": f"{root}/models"})
    ctx = context(root)
    result = preflight.run(cfg, ctx, backend_for(cfg))
    assert result["ok"] and [c["area"] for c in result["checks"]] == ["storage", "storage"]
    assert storage.read_json(preflight.result_uri(ctx)) == result
    # The probe objects are gone: only preflight.json remains.
    assert storage.list_uris(root + "/") == [preflight.result_uri(ctx)]


def test_bucket_denials_name_the_step_and_the_grant(proxied):  # noqa: F811
    """GCS refuses the upload, S3 the delete (403), below the official clients."""
    if proxied.scheme == "gs":
        proxied.proxy.fail(KINDS["gs"]["upload"], **proxied.error(403, "Forbidden"))
    else:
        proxied.proxy.fail(lambda r: r.method == "DELETE" or (
            r.method == "POST" and "delete" in r.path), **proxied.error(403, "AccessDenied"))
    cfg = parse_config({"artifact_root": proxied.root, "aws_conn_id": "s3_proxied"
                        if proxied.scheme == "s3" else ""})
    ctx = context(proxied.root)
    [message] = failures(cfg, ctx)
    folder = f"{ctx.step_uri('provision')}/.bertflow-preflight-"
    if proxied.scheme == "gs":
        assert message.startswith(f"Storage: cannot write {folder}")
        assert "access denied (403)" in message
        assert message.endswith(f"(grant the ambient account roles/storage.objectUser on "
                                f"bucket {BUCKET}, and the workers' identity too; {DOCS})")
    else:
        assert message.startswith(f"Storage: cannot delete {folder}")
        assert "access denied (AccessDenied)" in message
        assert message.endswith(
            f"(allow connection s3_proxied s3:ListBucket on arn:aws:s3:::{BUCKET} and "
            f"s3:PutObject, s3:GetObject, s3:DeleteObject on arn:aws:s3:::{BUCKET}/*; {DOCS})")


def test_a_missing_bucket_is_named(gcs_emulator):  # noqa: F811
    cfg = parse_config({"artifact_root": "gs://no-such-bucket-bertflow/art"})
    [message] = failures(cfg, context(cfg.artifact_root))
    assert "bucket 'no-such-bucket-bertflow' does not exist" in message


# --- Kubernetes ---------------------------------------------------------------------------------
@pytest.fixture
def kube(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with FakeKube() as fake:
        monkeypatch.setenv("KUBECONFIG", str(fake.write_kubeconfig(tmp_path / "kubeconfig")))
        yield fake


def k8s_config(root: str):
    return parse_config({"provisioner": "kubernetes", "artifact_root": root,
                         "k8s_namespace": "ml"})


def test_kubernetes_reviews_every_verb_the_backend_uses(kube, tmp_path):
    cfg = k8s_config(str(tmp_path / "art"))
    result = preflight.run(cfg, context(cfg.artifact_root), backend_for(cfg))
    assert all(c["ok"] for c in result["checks"])
    asked = {(a["verb"], a.get("group", ""), a["resource"], a.get("subresource", ""))
             for a in kube.access_reviews}
    assert asked == {
        *((v, "batch", "jobs", "") for v in ("create", "list", "delete")),
        *((v, "", "services", "") for v in ("create", "list", "delete")),
        *((v, "", "secrets", "") for v in ("create", "list", "delete")),
        *((v, "", "pods", "") for v in ("get", "list", "delete")),
        ("get", "", "pods", "log")}
    assert {a["namespace"] for a in kube.access_reviews} == {"ml"}


def test_kubernetes_denials_are_collected_with_the_role_to_grant(kube, tmp_path):
    kube.deny("create", "jobs", group="batch")
    kube.deny("delete", "jobs", group="batch")
    kube.deny("get", "pods", subresource="log")
    cfg = k8s_config(str(tmp_path / "art"))
    who = "the in-cluster service account or your kubeconfig user"
    assert failures(cfg, context(cfg.artifact_root)) == [
        f"Kubernetes: cannot create, delete jobs.batch in namespace ml (grant {who} a Role "
        f"with verbs [create, delete] on jobs in apiGroup batch; {DOCS})",
        f'Kubernetes: cannot get pods/log in namespace ml (grant {who} a Role with verbs '
        f'[get] on pods/log in apiGroup "" (core); {DOCS})']


def grant_namespace(namespace: str) -> None:
    """BUCKET's IAM policy gives the Workload Identity principals of `namespace`'s
    ServiceAccounts roles/storage.objectUser (the pods' identity on GKE without annotation)."""
    bucket = storage.open_storage(f"gs://{BUCKET}/").client.bucket(BUCKET)
    policy = bucket.get_iam_policy(requested_policy_version=3)
    policy.version = 3
    policy.bindings = [{"role": "roles/storage.objectUser", "members": [
        f"principalSet://iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/"
        f"proj.svc.id.goog/namespace/{namespace}"]}]
    bucket.set_iam_policy(policy)


def test_cli_prints_the_checks_writes_the_result_and_exits_2(kube, gcs_emulator):  # noqa: F811
    kube.deny("create", "secrets")
    grant_namespace("default")
    run_dir = f"gs://{BUCKET}/{uuid.uuid4().hex[:12]}/runs/bert_finetune/try1"
    done = cli("init-run", "--run-dir", run_dir, "--provisioner", "kubernetes")
    assert done.returncode == 0, done.stderr
    done = cli("preflight", "--run-dir", run_dir)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "FAIL kubernetes: create, list, delete secrets in namespace default" in done.stdout
    assert "ok   storage: write, read and delete" in done.stdout
    assert done.stderr.startswith("bertflow: error: preflight found 1 problem(s):\n"
                                  "- Kubernetes: cannot create secrets in namespace default")
    written = storage.read_json(f"{run_dir}/provision/preflight.json")
    assert written["ok"] is False and len(written["failures"]) == 1

    kube.denied.clear()
    done = cli("preflight", "--run-dir", run_dir)
    assert done.returncode == 0, done.stderr
    # 1 bucket probe, 5 access reviews, namespace, ServiceAccount, the pods' bucket access,
    # quota (no GPUs); not checked: the default image (no registry), its pull access.
    assert "n/a  image: pull access to the worker image(s): not checked: " in done.stdout
    assert done.stdout.rstrip().endswith(
        f"10 checks passed, 2 not checked; result in {run_dir}/provision/preflight.json")


def test_provision_stops_before_creating_anything_when_preflight_fails(kube,
                                                                       gcs_emulator):  # noqa: F811
    kube.deny("list", "pods")
    grant_namespace("ml")
    root = f"gs://{BUCKET}/{uuid.uuid4().hex[:12]}"
    cfg, ctx = k8s_config(root), context(root)
    init_run(cfg, ctx)
    with pytest.raises(preflight.PreflightError, match="cannot list pods in namespace ml"):
        provision_run(cfg, ctx)
    assert not storage.exists(ctx.manifest_uri("provision"))
    kube.denied.clear()
    assert provision_run(cfg, ctx) == ctx.manifest_uri("provision")


# --- Vertex AI ----------------------------------------------------------------------------------
@pytest.fixture
def vertex(monkeypatch):
    fake, iam = FakeVertex().start(), FakeIam().start()
    monkeypatch.setenv(vertex_client.ENDPOINT_ENV, fake.endpoint)
    monkeypatch.setenv(preflight.IAM_ENDPOINT_ENV, iam.endpoint)
    yield fake, iam
    fake.stop()
    iam.stop()


def vertex_config(root: str, **overrides):
    return parse_config({"provisioner": "vertex_ai", "artifact_root": root,
                         "gcp_project": "proj", "gcp_region": "us-central1",
                         "image_registry": REGISTRY,
                         "service_account": SA, **overrides})


def test_vertex_passes_with_a_region_that_answers_and_act_as(vertex, tmp_path):
    fake, iam = vertex
    iam.grants[SA] = {preflight.ACT_AS}
    cfg = vertex_config(str(tmp_path / "art"))
    result = preflight.run(cfg, context(cfg.artifact_root), backend_for(cfg))
    assert [c["what"] for c in result["checks"] if c["area"] == "vertex_ai"] == [
        "list CustomJobs in projects/proj/locations/us-central1",
        f"act as service account {SA}"]
    assert iam.requests == [(f"/v1/projects/-/serviceAccounts/{SA}:testIamPermissions",
                             {"permissions": ["iam.serviceAccounts.actAs"]})]
    assert not fake.jobs  # nothing was created


def test_vertex_failures_name_the_role(vertex, tmp_path):
    fake, iam = vertex
    cfg = vertex_config(str(tmp_path / "art"))
    fake.list_error = (403, "PERMISSION_DENIED", "Permission 'aiplatform.customJobs.list' "
                                                 "denied on resource")
    iam.grants[SA] = set()  # exists, but the caller holds no actAs on it
    assert failures(cfg, context(cfg.artifact_root)) == [
        "Vertex AI: cannot list custom jobs in projects/proj/locations/us-central1: "
        "Permission 'aiplatform.customJobs.list' denied on resource (grant the caller "
        "roles/aiplatform.user on project proj, which holds aiplatform.customJobs.create/"
        f"get/list/cancel; and enable aiplatform.googleapis.com; {DOCS})",
        f"Vertex AI: the caller may not act as {SA}, which runs the job's workers (grant "
        f"the caller roles/iam.serviceAccountUser on the service account {SA} (it holds "
        f"iam.serviceAccounts.actAs); {DOCS})"]

    fake.list_error = None
    other = "nobody@proj.iam.gserviceaccount.com"
    assert failures(vertex_config(cfg.artifact_root, service_account=other),
                    context(cfg.artifact_root)) == [
        f"Vertex AI: service account {other} does not exist (check service_account, or "
        "create it: gcloud iam service-accounts create)"]


# --- Cloud TPU ----------------------------------------------------------------------------------
@pytest.fixture
def fake_tpu(monkeypatch):
    fake = FakeTpu().start()
    monkeypatch.setenv(tpu_client.ENDPOINT_ENV, fake.endpoint)
    yield fake
    fake.stop()


def tpu_config(root: str, **overrides):
    return parse_config({"provisioner": "tpu_vm", "accelerator": "tpu", "tpu_address": "local",
                         "tpu_zone": "us-west4-a", "tpu_project": "proj",
                         "accelerator_type": "v5litepod-8", "artifact_root": root,
                         "image_registry": REGISTRY, **overrides})


def test_tpu_zone_offers_the_type_and_the_runtime(fake_tpu, tmp_path):
    cfg = tpu_config(str(tmp_path / "art"))
    result = preflight.run(cfg, context(cfg.artifact_root), backend_for(cfg))
    assert [c["what"] for c in result["checks"] if c["area"] == "tpu_vm"] == [
        "us-west4-a offers accelerator type v5litepod-8",
        f"us-west4-a offers runtime version {tpu_render.runtime_version(cfg)}"]
    assert not fake_tpu.queued  # nothing was queued


def test_tpu_failures_say_what_the_zone_offers(fake_tpu, tmp_path):
    fake_tpu.accelerator_types = ["v5litepod-4", "v5litepod-16", "v6e-8"]
    cfg = tpu_config(str(tmp_path / "art"), tpu_runtime_version="tpu-vm-tf-2.99.0-pjrt")
    assert failures(cfg, context(cfg.artifact_root)) == [
        "Cloud TPU: zone us-west4-a does not offer accelerator type v5litepod-8 (set "
        "accelerator_type to one it offers, e.g. v5litepod-16, v5litepod-4; or pick another "
        "tpu_zone)",
        "Cloud TPU: zone us-west4-a does not offer runtime version tpu-vm-tf-2.99.0-pjrt (set "
        "tpu_runtime_version to one it offers, e.g. tpu-ubuntu2204-base, "
        "tpu-vm-tf-2.18.0-pjrt, tpu-vm-tf-2.20.0-pjrt, tpu-vm-tf-2.20.0-pod-pjrt, "
        "v2-alpha-tpuv5-lite; or pick another tpu_zone)"]

    fake_tpu.zones = {"us-central2-b"}
    messages = failures(tpu_config(cfg.artifact_root), context(cfg.artifact_root))
    assert len(messages) == 2 and all(m.startswith(
        "Cloud TPU: zone us-west4-a of project proj does not answer: Location "
        "projects/proj/locations/us-west4-a is not found") for m in messages)


def test_local_runs_check_only_the_buckets(tmp_path):
    cfg = parse_config({"artifact_root": str(tmp_path / "art")})
    result = preflight.run(cfg, context(cfg.artifact_root), backend_for(cfg))
    assert {c["area"] for c in result["checks"]} == {"storage"}
    assert isinstance(preflight.PreflightError(["x"]), BertflowError)
    assert json.loads(json.dumps(result)) == result


def test_the_reviewed_access_is_every_call_the_kubernetes_backend_makes():
    """ACCESS is read off tasks/provision/kubernetes/{backend,pod_logs}.py: a new client call
    there without its access review here fails this test."""
    import re

    from tasks.config import PROJECT_ROOT

    source = "".join((PROJECT_ROOT / "tasks" / "provision" / "kubernetes" / name).read_text()
                     for name in ("backend.py", "pod_logs.py"))
    calls = set(re.findall(r"\.(core|batch)\.(create|list|delete|read)_namespaced_(\w+)",
                           source))
    verbs = {"create": "create", "list": "list", "delete": "delete", "read": "get"}
    used = set()
    for api, verb, kind in calls:
        resource, sub = ("pods", "log") if kind == "pod_log" else (kind + "s", "")
        used.add((verbs[verb], "batch" if api == "batch" else "", resource, sub))
    reviewed = {(verb, group, resource, sub) for group, resource, sub, verb_list
                in k8s_preflight.ACCESS for verb in verb_list}
    assert used == reviewed


def test_provision_queues_no_tpu_when_the_zone_lacks_the_type(fake_tpu,
                                                              gcs_emulator):  # noqa: F811
    fake_tpu.accelerator_types = ["v5litepod-4"]
    root = f"gs://{BUCKET}/{uuid.uuid4().hex[:12]}"
    cfg, ctx = tpu_config(root), context(root)
    init_run(cfg, ctx)
    with pytest.raises(preflight.PreflightError, match="does not offer accelerator type "
                                                       "v5litepod-8"):
        provision_run(cfg, ctx)
    assert not fake_tpu.queued and not any(r["method"] == "POST" for r in fake_tpu.requests)
    assert storage.read_json(preflight.result_uri(ctx))["ok"] is False


def test_vertex_without_credentials_says_so(tmp_path, monkeypatch):
    monkeypatch.delenv(vertex_client.ENDPOINT_ENV, raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing-key.json"))
    cfg = vertex_config(str(tmp_path / "art"))
    [message] = failures(cfg, context(cfg.artifact_root))
    assert message.startswith("Vertex AI: no credentials (DefaultCredentialsError: ")
    assert message.endswith("set gcp_conn_id or configure application-default credentials")
