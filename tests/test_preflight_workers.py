"""Preflight of the workers' side (tasks/provision/{bucket_access,image_registry,quota,
worker_identity}.py, tasks/provision/kubernetes/cluster_preflight.py), with the real clients
over HTTP: google-cloud-storage's Bucket.get_iam_policy against the GCS emulator (which stores
bucket IAM policies), boto3's IAM client against tests/fake_aws_iam.py and its ECR client
against moto's server, the `kubernetes` client against tests/fake_kubernetes.py, the OCI
Distribution API against tests/fake_registry.py, the Cloud Quotas REST API against
tests/fake_quotas.py. Nothing is created on any of them.
"""
from __future__ import annotations

import uuid
from contextlib import contextmanager

import pytest

from fake_aws_iam import FakeAwsIam
from fake_iam import FakeIam
from fake_kubernetes import FakeKube
from fake_quotas import FakeQuotas, quota_info
from fake_registry import FakeRegistry
from fake_tpu import FakeTpu
from fake_vertex import FakeVertex
from fault_proxy import FaultProxy
from storage_servers import BUCKET, connections, gcs_emulator, s3_server  # noqa: F401
from tasks.config import parse_config
from tasks.io import cloud_storage, storage
from tasks.provision import (bucket_access, gcs_impersonation, image_registry, preflight,
                             quota)
from tasks.provision.backends import backend_for
from tasks.provision.tpu_vm import client as tpu_client
from tasks.provision.vertex_ai import client as vertex_client
from tasks.runs.runlayout import RunContext

DOCS = "docs/deployment-iam.md"
SA = "trainer@proj.iam.gserviceaccount.com"
ROLE_ARN = "arn:aws:iam::123456789012:role/bertflow-workers"
GKE = "iam.gke.io/gcp-service-account"
IRSA = "eks.amazonaws.com/role-arn"


def context(root: str) -> RunContext:
    return RunContext(root, "bert_finetune", f"manual__{uuid.uuid4().hex[:8]}")


def run(cfg) -> dict:
    """preflight.run's result, failed or not."""
    try:
        return preflight.run(cfg, context(cfg.artifact_root), backend_for(cfg))
    except preflight.PreflightError as err:
        return err.result


def area(result: dict, name: str) -> list[dict]:
    return [c for c in result["checks"] if c["area"] == name]


def set_policy(*bindings: dict) -> None:
    """BUCKET's IAM policy, through the real client (the emulator stores it)."""
    bucket = storage.open_storage(f"gs://{BUCKET}/").client.bucket(BUCKET)
    policy = bucket.get_iam_policy(requested_policy_version=3)
    policy.version = 3
    policy.bindings = list(bindings)
    bucket.set_iam_policy(policy)


def gs_root() -> str:
    return f"gs://{BUCKET}/{uuid.uuid4().hex[:12]}"


@contextmanager
def bucket_permissions(held: dict[str, set[str]]):
    """The emulator's testIamPermissions (a stub granting everything) answers, per bearer
    token `token-for-EMAIL` (tests/fake_iam.py's impersonation tokens), what held[EMAIL]
    holds of the asked permissions."""
    from gcp_storage_emulator import server
    from gcp_storage_emulator.handlers import buckets

    def answer(request, response, storage_, *args, **kwargs):
        token = request._request_handler.headers.get("Authorization", "")
        email = token.removeprefix("Bearer token-for-")
        asked = request.query.get("permissions") or []
        response.json({"kind": "storage#testIamPermissionsResponse",
                       "permissions": [p for p in asked if p in held.get(email, ())]})

    def swap(old, new):
        for _, handlers in server.HANDLERS:
            for method, handler in handlers.items():
                if handler is old:
                    handlers[method] = new

    swap(buckets.test_iam_permissions, answer)
    try:
        yield
    finally:
        swap(answer, buckets.test_iam_permissions)


# --- fixtures -----------------------------------------------------------------------------
@pytest.fixture
def registry():
    fake = FakeRegistry().start()
    yield fake
    fake.stop()


@pytest.fixture
def quotas(monkeypatch):
    fake = FakeQuotas().start()
    monkeypatch.setenv(quota.ENDPOINT_ENV, fake.endpoint)
    yield fake
    fake.stop()


@pytest.fixture
def vertex(monkeypatch, registry, quotas):
    fake, iam = FakeVertex().start(), FakeIam().start()
    monkeypatch.setenv(vertex_client.ENDPOINT_ENV, fake.endpoint)
    monkeypatch.setenv(preflight.IAM_ENDPOINT_ENV, iam.endpoint)
    monkeypatch.setenv(gcs_impersonation.ENDPOINT_ENV, iam.endpoint)
    iam.grants[SA] = {preflight.ACT_AS}
    yield fake
    fake.stop()
    iam.stop()


@pytest.fixture
def iam(monkeypatch):
    """Google IAM, for impersonation: no account may be impersonated unless granted."""
    fake = FakeIam().start()
    monkeypatch.setenv(gcs_impersonation.ENDPOINT_ENV, fake.endpoint)
    yield fake
    fake.stop()


@pytest.fixture
def kube(tmp_path, monkeypatch, iam):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with FakeKube() as fake:
        monkeypatch.setenv("KUBECONFIG", str(fake.write_kubeconfig(tmp_path / "kubeconfig")))
        yield fake


@pytest.fixture
def aws_iam(monkeypatch):
    fake = FakeAwsIam().start()
    monkeypatch.setenv("AWS_ENDPOINT_URL_IAM", fake.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFAKECALLER000001")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fake-caller-secret")
    yield fake
    fake.stop()


def vertex_config(root: str, registry: FakeRegistry, **overrides):
    return parse_config({"provisioner": "vertex_ai", "artifact_root": root,
                         "gcp_project": "proj", "gcp_region": "us-central1",
                         "image_registry": f"{registry.host}/proj/repo",
                         "service_account": SA, **overrides})


def publish(registry: FakeRegistry, image: str) -> None:
    """`image` (host/name:tag) exists, in a public repository."""
    _, name, reference = image_registry.parse(image)
    registry.public.add(name)
    registry.images.add(f"{name}:{reference}")


# --- Cloud Storage: the bucket's IAM policy -------------------------------------------------
def test_the_bucket_policy_decides_a_service_accounts_access(gcs_emulator):  # noqa: F811
    cfg = parse_config({"artifact_root": gs_root(), "train_uri": "gs://other-data/train.csv"})
    who = f"service_account {SA}"

    def check():
        [artifacts, data] = bucket_access.gcs_checks(cfg, [f"serviceAccount:{SA}"], who)
        assert data.ok is False and "bucket other-data (train_uri) does not exist" in \
            data.message
        return artifacts

    set_policy()
    found = check()
    assert found.what == f"{who} may read and write gs://{BUCKET} (artifact_root, export_uri)"
    # A grant on the project would give the access too: without impersonation the bucket's
    # policy cannot refuse the run, only say what to grant.
    assert found.ok and not found.checked
    assert found.message == (
        f"not checked: bucket {BUCKET}'s IAM policy grants serviceAccount:{SA} no "
        f"storage.objects.create, storage.objects.delete, storage.objects.get, "
        f"storage.objects.list; unless a grant on the project, folder or organisation gives "
        f"it (preflight cannot see those without impersonating the account), grant it "
        f"roles/storage.objectUser on the bucket: gcloud storage buckets "
        f"add-iam-policy-binding gs://{BUCKET} --member=serviceAccount:{SA} "
        f"--role=roles/storage.objectUser; {DOCS}")

    set_policy({"role": "roles/storage.objectViewer", "members": [f"serviceAccount:{SA}"]})
    assert "no storage.objects.create, storage.objects.delete;" in check().message

    set_policy({"role": "roles/storage.objectViewer", "members": [f"serviceAccount:{SA}"]},
               {"role": "roles/storage.objectUser", "members": [f"serviceAccount:{SA}"],
                "condition": {"title": "only-runs", "expression":
                              'resource.name.startsWith("projects/_/buckets/x/objects/runs")'}})
    found = check()
    assert found.ok and not found.checked
    assert found.message == (
        f"not checked: on bucket {BUCKET}, {who} lacks storage.objects.create, "
        f"storage.objects.delete unless roles/storage.objectUser with the IAM condition "
        f"only-runs grants it, which IAM decides at request time")

    set_policy({"role": "roles/storage.objectUser", "members": [f"serviceAccount:{SA}"]})
    assert check().ok and check().checked


def test_impersonation_asks_the_account_itself(gcs_emulator, iam):  # noqa: F811
    """Where the caller may impersonate the account, its own testIamPermissions decides,
    grants on the project included; else the bucket's policy does."""
    from fake_iam import GET_TOKEN

    cfg = parse_config({"artifact_root": gs_root()})
    who = f"service_account {SA}"
    set_policy()  # nothing on the bucket: a project-level grant
    iam.grants[SA] = {GET_TOKEN}
    read_only = {SA: {"storage.objects.get", "storage.objects.list"}}
    with bucket_permissions(read_only):
        [found] = bucket_access.gcs_checks(cfg, [f"serviceAccount:{SA}"], who, account=SA)
    assert not found.ok and found.message == (
        f"Workers: {who} cannot read and write gs://{BUCKET} (artifact_root, export_uri): "
        f"asked as the account itself (impersonated), Cloud Storage grants it no "
        f"storage.objects.create, storage.objects.delete (grant it roles/storage.objectUser "
        f"on bucket {BUCKET}; {DOCS})")
    assert (f"/v1/projects/-/serviceAccounts/{SA}:generateAccessToken",
            {"scope": ["https://www.googleapis.com/auth/cloud-platform"],
             "lifetime": "300s"}) in iam.requests
    with bucket_permissions({SA: set(bucket_access.WRITE)}):
        [found] = bucket_access.gcs_checks(cfg, [f"serviceAccount:{SA}"], who, account=SA)
    assert found.ok and found.message == "asked as the account itself (impersonated)"

    iam.grants[SA] = set()  # no impersonation: the bucket's (empty) policy decides
    with bucket_permissions({SA: set(bucket_access.WRITE)}):
        [found] = bucket_access.gcs_checks(cfg, [f"serviceAccount:{SA}"], who, account=SA)
    assert found.ok and not found.checked
    assert "'s IAM policy grants serviceAccount:" in found.message


def test_a_bucket_policy_the_caller_may_not_read_is_not_checked(gcs_emulator,  # noqa: F811
                                                                monkeypatch):
    proxy = FaultProxy(gcs_emulator)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    monkeypatch.setattr(cloud_storage, "_clients", {})
    proxy.fail(lambda r: r.method == "GET" and r.path.split("?")[0].endswith("/iam"),
               status=403, content_type="application/json",
               body=b'{"error": {"code": 403, "message": "no storage.buckets.getIamPolicy"}}')
    cfg = parse_config({"artifact_root": gs_root()})
    [found] = bucket_access.gcs_checks(cfg, [f"serviceAccount:{SA}"], f"service_account {SA}")
    assert found.ok and not found.checked
    assert found.message.startswith(
        f"not checked: the caller may not read bucket {BUCKET}'s IAM policy (it needs "
        f"storage.buckets.getIamPolicy, e.g. roles/storage.admin on the bucket); make sure "
        f"service_account {SA} holds roles/storage.objectUser on it; {DOCS}")
    proxy.stop()


# --- Vertex AI ------------------------------------------------------------------------------
def test_vertex_checks_the_job_account_the_image_and_the_gpu_quota(
        vertex, registry, quotas, gcs_emulator):  # noqa: F811
    cfg = vertex_config(gs_root(), registry, accelerator="gpu", accelerator_type="NVIDIA_L4",
                        num_workers=2)
    image = f"{registry.host}/proj/repo/bertflow-trainer-gpu:{cfg_version()}"
    publish(registry, image)
    metric = "aiplatform.googleapis.com/custom_model_training_nvidia_l4_gpus"
    quotas.infos[quota.VERTEX] = [quota_info(f"{quota.VERTEX}/other_{i}", {}, 9)
                                  for i in range(3)] + [
        quota_info(metric, {"us-central1": 2}, default=0)]  # on the second page
    set_policy({"role": "roles/storage.objectUser", "members": [f"serviceAccount:{SA}"]})
    result = run(cfg)
    assert result["ok"], result["failures"]
    lines = preflight.summary(result).splitlines()
    assert f"ok   workers: service_account {SA} may read and write gs://{BUCKET} " \
           f"(artifact_root, export_uri)" in lines
    assert f"ok   image: {image} exists (every step)" in lines
    assert "ok   quota: 2 x NVIDIA_L4 in us-central1" in lines
    assert ("n/a  image: pull access to the worker image(s): not checked: the Vertex AI "
            "Service Agent (service-PROJECT_NUMBER@gcp-sa-aiplatform.iam.gserviceaccount.com)"
            " pulls them") in "\n".join(lines)
    assert not vertex.jobs and not registry.requests[0][0] == "GET"  # reads only

    quotas.infos[quota.VERTEX][-1] = quota_info(metric, {"us-central1": 1})
    registry.images.clear()
    set_policy()
    failures = run(cfg)["failures"]
    assert [f.split(":")[0] for f in failures] == ["Image", "Quota"]
    assert failures[0] == (
        f"Image: {image} is not in registry {registry.host} (no manifest {cfg_version()} in "
        f"repository proj/repo/bertflow-trainer-gpu); check worker_image / image_registry, or "
        f"build and push it (docker/Dockerfile.trainer-KIND: docker build, docker push)")
    assert failures[1] == (
        f"Quota: project proj may use 1 of {metric} in us-central1, and one step asks for 2 "
        f"(request more: IAM & Admin > Quotas, or set num_workers or devices_per_worker "
        f"smaller, or use a region with quota)")

    quotas.error = (403, "PERMISSION_DENIED", "cloudquotas.quotas.get denied")
    [check] = area(run(cfg), "quota")
    assert check["ok"] and not check["checked"]
    assert check["message"].startswith("not checked: Cloud Quotas answered 403 "
                                       "cloudquotas.quotas.get denied")


def cfg_version() -> str:
    from tasks import __version__

    return __version__


def test_vertex_spot_counts_against_the_preemptible_metric():
    assert quota.vertex_metric("NVIDIA_TESLA_T4", spot=True) == \
        "aiplatform.googleapis.com/custom_model_training_preemptible_nvidia_t4_gpus"
    assert quota.vertex_metric("TPU_V5_LITEPOD", spot=False) is None


def test_vertex_without_service_account_says_what_it_cannot_see(vertex, registry,
                                                                tmp_path):
    cfg = vertex_config("gs://some-bucket/art", registry, service_account="")
    found = bucket_access_lines(cfg)
    assert found == [
        "n/a  workers: workers' access to the buckets: not checked: no service_account: the "
        "workers run as the Vertex AI Custom Code Service Agent (service-PROJECT_NUMBER@"
        "gcp-sa-aiplatform-cc.iam.gserviceaccount.com), whose project number preflight does "
        "not look up; grant it roles/storage.objectUser on the buckets, or set "
        "service_account to have it checked"]


def bucket_access_lines(cfg) -> list[str]:
    from tasks.provision import worker_identity

    checks = worker_identity.service_account_checks(cfg)
    return preflight.summary({"checks": [c.__dict__ for c in checks]}).splitlines()


# --- Cloud TPU ------------------------------------------------------------------------------
def test_tpu_vm_checks_its_account_on_the_run_folder_and_says_quota_is_not_checked(
        monkeypatch, registry, gcs_emulator):  # noqa: F811
    fake = FakeTpu().start()
    monkeypatch.setenv(tpu_client.ENDPOINT_ENV, fake.endpoint)
    root = gs_root()
    cfg = parse_config({"provisioner": "tpu_vm", "accelerator": "tpu", "tpu_address": "local",
                        "tpu_zone": "us-west4-a", "tpu_project": "proj",
                        "accelerator_type": "v5litepod-8", "artifact_root": root,
                        "export_uri": f"{root}/exports",
                        "image_registry": f"{registry.host}/proj/repo",
                        "service_account": SA})
    publish(registry, f"{registry.host}/proj/repo/bertflow-trainer-tpu:{cfg_version()}")
    set_policy({"role": "roles/storage.objectAdmin", "members": [f"serviceAccount:{SA}"]})
    result = run(cfg)
    fake.stop()
    assert result["ok"], result["failures"]
    # The VM runs train and evaluate: the run folder only (export runs on the Airflow worker).
    assert [c["what"] for c in area(result, "workers")] == [
        f"service_account {SA} may read and write gs://{BUCKET} (artifact_root)"]
    [quota_check] = area(result, "quota")
    assert not quota_check["checked"] and "per generation and kind" in quota_check["message"]
    assert not fake.queued


# --- Kubernetes -----------------------------------------------------------------------------
def k8s_config(root: str, **overrides):
    return parse_config({"provisioner": "kubernetes", "artifact_root": root,
                         "k8s_namespace": "train-ns", **overrides})


def test_kubernetes_gke_annotation_names_the_google_account_and_nodes_are_found(
        kube, gcs_emulator, quotas, monkeypatch):  # noqa: F811
    monkeypatch.setenv(quota.COMPUTE_ENDPOINT_ENV, quotas.endpoint)
    quotas.regions[("proj", "us-central1")] = [
        {"metric": "CPUS", "limit": 96, "usage": 8},
        {"metric": "NVIDIA_L4_GPUS", "limit": 2, "usage": 1}]
    kube.provider_id = "gce://proj/us-central1-a/gke-gpu-pool-1"
    kube.service_accounts = {("train-ns", "trainer"): {GKE: SA}}
    kube.nodes = [{"cloud.google.com/gke-accelerator": "nvidia-l4"}]
    set_policy({"role": "roles/storage.objectUser", "members": [f"serviceAccount:{SA}"]})
    cfg = k8s_config(gs_root(), service_account="trainer", accelerator="gpu",
                     accelerator_type="nvidia-l4")
    result = run(cfg)
    assert result["ok"], result["failures"]
    lines = preflight.summary(result).splitlines()
    for line in ("ok   kubernetes: namespace train-ns exists",
                 "ok   kubernetes: ServiceAccount trainer exists in namespace train-ns",
                 f"ok   workers: {SA} (annotation {GKE} of ServiceAccount trainer) may read "
                 f"and write gs://{BUCKET} (artifact_root, export_uri)",
                 "ok   kubernetes: nodes with cloud.google.com/gke-accelerator=nvidia-l4 "
                 "(train, evaluate)",
                 "ok   quota: 1 x nvidia-l4 in us-central1"):
        assert line in lines
    assert area(result, "quota")[0]["message"] == "quota 2; 1 in use now"
    text = "\n".join(lines)
    assert (f"n/a  workers: trainer may act as {SA}: not checked: the Google service "
            f"account's IAM policy must give serviceAccount:PROJECT.svc.id.goog[train-ns/"
            f"trainer] roles/iam.workloadIdentityUser") in text
    assert "n/a  image: bertflow-trainer-cpu:" in text  # no registry: the nodes' own

    two = k8s_config(cfg.artifact_root, service_account="trainer", accelerator="gpu",
                     accelerator_type="nvidia-l4", num_workers=3)
    assert run(two)["failures"] == [
        "Quota: project proj may use 2 of NVIDIA_L4_GPUS in us-central1, and one step asks "
        "for 3 (request more: IAM & Admin > Quotas, or set num_workers or devices_per_worker "
        "smaller, or use a region with quota)"]

    kube.nodes = []
    result = run(cfg)
    [nodes] = [c for c in area(result, "kubernetes") if c["what"].startswith("nodes")]
    assert not nodes["checked"] and "no node has these labels now" in nodes["message"]
    [gpus] = area(result, "quota")
    assert not gpus["checked"] and "(a gce:// providerID)" in gpus["message"]


def test_kubernetes_without_annotation_checks_the_workload_identity_principal(
        kube, gcs_emulator):  # noqa: F811
    cfg = k8s_config(gs_root())
    set_policy()
    result = run(cfg)
    member = ("principal://iam.googleapis.com/projects/PROJECT_NUMBER/locations/global/"
              "workloadIdentityPools/PROJECT.svc.id.goog/subject/ns/train-ns/sa/default")
    [found] = [c for c in result["checks"] if c["what"].startswith(
        "ServiceAccount train-ns/default (Workload Identity Federation principal) may read "
        f"and write gs://{BUCKET}")]
    # Not on the bucket's policy: said, not refused (a project grant is invisible here).
    assert found["ok"] and not found["checked"] and result["ok"]
    assert found["message"].startswith(
        f"not checked: bucket {BUCKET}'s IAM policy grants {member} no ")
    # The namespace's principal set, with the real project number and pool, grants it.
    set_policy({"role": "roles/storage.objectUser", "members": [
        "principalSet://iam.googleapis.com/projects/123/locations/global/workloadIdentityPools"
        "/proj.svc.id.goog/namespace/train-ns"]})
    [found] = [c for c in run(cfg)["checks"] if c["what"] == found["what"]]
    assert found["ok"] and found["checked"]


def test_kubernetes_missing_namespace_and_service_account_name_the_fields(kube, tmp_path):
    kube.namespaces = {"default"}
    kube.service_accounts = {}
    cfg = k8s_config(str(tmp_path / "art"), service_account="trainer")
    assert run(cfg)["failures"] == [
        "Kubernetes: k8s_namespace train-ns does not exist (create it: kubectl create "
        "namespace train-ns; or set k8s_namespace to the workers' namespace)",
        "Kubernetes: service_account trainer does not exist in namespace train-ns (create it: "
        "kubectl create serviceaccount trainer -n train-ns, with the annotation that binds it "
        f"to a cloud identity; or set service_account; {DOCS})"]


def test_kubernetes_reads_the_caller_may_not_make_are_not_checked(kube, gcs_emulator):  # noqa: F811
    for resource in ("namespaces", "serviceaccounts", "nodes"):
        kube.forbid(resource)
    cfg = k8s_config(gs_root(), accelerator="gpu", accelerator_type="nvidia-l4")
    result = run(cfg)
    assert result["ok"], result["failures"]
    skipped = {c["what"]: c["message"] for c in result["checks"] if not c["checked"]}
    assert skipped["namespace train-ns exists"].startswith(
        "not checked: the caller may not read namespaces (403 Forbidden); grant it a "
        "ClusterRole with get on namespaces and list on nodes")
    assert skipped["the pods' access to gs:// folders"] == (
        "not checked: ServiceAccount default was not read, so its cloud identity is unknown")
    assert any(w.startswith("nodes with cloud.google.com/gke-accelerator=nvidia-l4")
               for w in skipped)
    assert preflight.counts(result).endswith(f"{len(skipped)} not checked")


def test_eks_irsa_role_is_simulated_for_the_s3_actions(kube, aws_iam, s3_server,  # noqa: F811
                                                        connections):  # noqa: F811
    kube.service_accounts = {("train-ns", "trainer"): {IRSA: ROLE_ARN}}
    root = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"
    cfg = k8s_config(root, k8s_platform="eks", service_account="trainer")
    prefix = root.split("/", 3)[3]
    aws_iam.roles[ROLE_ARN] = {
        "s3:GetObject": [f"arn:aws:s3:::{BUCKET}/*"], "s3:PutObject": [f"arn:aws:s3:::{BUCKET}/*"],
        "s3:ListBucket": [f"arn:aws:s3:::{BUCKET}"]}
    who = f"IAM role {ROLE_ARN} (annotation {IRSA} of ServiceAccount trainer)"
    assert run(cfg)["failures"] == [
        f"Workers: {who} is not allowed s3:DeleteObject on arn:aws:s3:::{BUCKET}/{prefix}/* "
        f"(implicitDeny); s3:DeleteObject on arn:aws:s3:::{BUCKET}/{prefix}/models/* "
        f"(implicitDeny) (add them to the role's policy; {DOCS})"]
    asked = {(r["ActionNames.member.1"], r["ResourceArns.member.1"]) for r in aws_iam.requests}
    assert (f"s3:ListBucket", f"arn:aws:s3:::{BUCKET}") in asked
    assert {r["PolicySourceArn"] for r in aws_iam.requests} == {ROLE_ARN}

    aws_iam.roles[ROLE_ARN]["s3:DeleteObject"] = [f"arn:aws:s3:::{BUCKET}/{prefix}/*"]
    assert run(cfg)["ok"]

    aws_iam.deny_caller = True
    [check] = area(run(cfg), "workers")
    assert not check["checked"] and "iam:SimulatePrincipalPolicy" in check["message"]

    aws_iam.deny_caller = False
    kube.service_accounts = {("train-ns", "trainer"): {IRSA: ROLE_ARN + "-gone"}}
    [failure] = run(cfg)["failures"]
    assert failure.startswith(f"Workers: IAM role {ROLE_ARN}-gone (")
    assert "does not exist (fix the eks.amazonaws.com/role-arn annotation" in failure

    kube.service_accounts = {("train-ns", "trainer"): {}}
    [check] = area(run(cfg), "workers")
    assert not check["checked"] and "EKS Pod Identity association" in check["message"]


# --- images ---------------------------------------------------------------------------------
def test_image_references_are_read_as_docker_reads_them():
    parse = image_registry.parse
    assert parse("us-docker.pkg.dev/p/r/img:1.0") == ("us-docker.pkg.dev", "p/r/img", "1.0")
    assert parse("localhost:5000/img") == ("localhost:5000", "img", "latest")
    assert parse("docker.io/library/python@sha256:ab") == ("docker.io", "library/python",
                                                           "sha256:ab")
    assert parse("bertflow-trainer-cpu:0.1") == ("", "bertflow-trainer-cpu", "0.1")


def test_image_exists_behind_the_token_challenge(registry):
    cfg = parse_config({})
    image = f"{registry.host}/team/trainer:1"
    publish(registry, image)
    assert image_registry.exists(cfg, image, "train").ok
    assert [r[2] for r in registry.requests if r[1].startswith("/v2/")] == [
        "", "Bearer token-for-team/trainer"]  # challenged, then the token

    missing = image_registry.exists(cfg, f"{registry.host}/team/trainer:2", "train")
    assert not missing.ok and missing.message.startswith(
        f"Image: {registry.host}/team/trainer:2 is not in registry {registry.host}")

    registry.private.add("secret/trainer")
    hidden = image_registry.exists(cfg, f"{registry.host}/secret/trainer:1", "train")
    assert hidden.ok and not hidden.checked
    assert hidden.message.startswith(f"not checked: registry {registry.host} refused the "
                                     f"caller (401)")


def test_ecr_images_are_described_with_boto3(s3_server, monkeypatch):  # noqa: F811
    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL_ECR", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFAKECALLER000001")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fake-caller-secret")
    ecr = boto3.client("ecr", region_name="us-east-1", endpoint_url=s3_server)
    repo = f"bertflow-{uuid.uuid4().hex[:6]}"
    account = ecr.create_repository(repositoryName=repo)["repository"]["registryId"]
    ecr.put_image(repositoryName=repo, imageTag="1.0", imageManifest=(
        '{"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2'
        '+json", "config": {}, "layers": []}'))
    host = f"{account}.dkr.ecr.us-east-1.amazonaws.com"
    cfg = parse_config({})
    assert image_registry.exists(cfg, f"{host}/{repo}:1.0", "train").ok
    missing = image_registry.exists(cfg, f"{host}/{repo}:2.0", "train")
    assert not missing.ok and "(no manifest 2.0 in repository" in missing.message


def test_the_documented_cluster_role_is_exactly_preflights_reads():
    """docs/preflight-and-logs.md's bertflow-preflight ClusterRole validates against the
    Kubernetes schema, and its rules are the reads cluster_preflight.py makes."""
    import re

    import kubernetes_validate
    import yaml

    from tasks.config import PROJECT_ROOT
    from test_kubernetes import K8S_VERSION

    page = (PROJECT_ROOT / "docs" / "preflight-and-logs.md").read_text()
    [role] = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", page, re.S)
              if "bertflow-preflight" in block]
    kubernetes_validate.validate(role, K8S_VERSION, strict=True)
    source = (PROJECT_ROOT / "tasks" / "provision" / "kubernetes" /
              "cluster_preflight.py").read_text()
    calls = set(re.findall(r"core\.(read|list)_(?:namespaced_)?(\w+?)\(", source))
    verbs = {"read": "get", "list": "list"}
    made = {(verbs[verb], kind.replace("_", "") + "s") for verb, kind in calls}
    granted = {(verb, resource) for rule in role["rules"] for resource in rule["resources"]
               for verb in rule["verbs"]}
    assert made == granted == {("get", "namespaces"), ("list", "nodes"),
                               ("get", "serviceaccounts")}
