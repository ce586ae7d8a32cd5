"""The workers' side of the Kubernetes preflight: what the pods need that exists before them,
read (never created) with the caller's cluster identity through the `kubernetes` client:

- the namespace (`GET /api/v1/namespaces/{k8s_namespace}`; cluster-scoped, so the caller
  needs `get` on namespaces from a ClusterRole);
- the pods' ServiceAccount (`GET .../serviceaccounts/{service_account or default}`) and the
  cloud identity it carries:
  - GKE: the annotation `iam.gke.io/gcp-service-account` names the Google service account
    the pods act as; without it, the Workload Identity Federation principal of the
    ServiceAccount itself (GKE docs, "Authenticate to Google Cloud APIs from GKE
    workloads": `principal://iam.googleapis.com/projects/NUMBER/locations/global/
    workloadIdentityPools/PROJECT.svc.id.goog/subject/ns/NAMESPACE/sa/KSA`, or the
    `principalSet://.../namespace/NAMESPACE` of every ServiceAccount of the namespace);
  - EKS: the annotation `eks.amazonaws.com/role-arn` (Amazon EKS User Guide, "IAM roles for
    service accounts": "Assign IAM roles to Kubernetes service accounts"). EKS Pod Identity
    associations live in the EKS API, not on the ServiceAccount, so they are "not checked";
  then the buckets' side of that identity (tasks/provision/bucket_access.py). Where the run
  gives the pods a connection (gcp_conn_id / aws_conn_id, through the run's Secret) the pods
  use the caller's own key, which the bucket probe already tried;
- nodes with each step's nodeSelector (`GET /api/v1/nodes?labelSelector=...`; `list` on
  nodes from a ClusterRole). A pool scaled to zero, GKE node auto-provisioning and Karpenter
  have no Node objects until pods wait, so no match is "not checked", not a failure;
- every Job's image in its registry (tasks/provision/image_registry.py);
- GKE GPU quota in the cluster's region (tasks/provision/kubernetes/gpu_quota.py).
"""
from __future__ import annotations

from tasks.config import RunConfig
from tasks.provision import bucket_access, image_registry
from tasks.provision.kubernetes import gpu_quota, render
from tasks.provision.preflight import DOCS, Check, not_checked
from tasks.provision.spec import WORKER_STEPS, step_spec
from tasks.runs.runlayout import RunContext

AREA = "kubernetes"
# GKE, "Authenticate to Google Cloud APIs from GKE workloads" (link a Kubernetes
# ServiceAccount to a Google service account).
GKE_SA_ANNOTATION = "iam.gke.io/gcp-service-account"
# Amazon EKS User Guide, "Assign IAM roles to Kubernetes service accounts".
IRSA_ANNOTATION = "eks.amazonaws.com/role-arn"
_WIF = "iam.googleapis.com/projects/*/locations/global/workloadIdentityPools/*.svc.id.goog"
READER_RBAC = (f"a ClusterRole with get on namespaces and list on nodes, and get on "
               f"serviceaccounts in the namespace; {DOCS}")


def checks(cfg: RunConfig, ctx: RunContext, backend) -> list[Check]:
    from kubernetes import client

    core = client.CoreV1Api(backend.api(cfg).core.api_client)
    found = [_namespace(core, cfg)]
    account, sa_check = _service_account(core, cfg)
    found.append(sa_check)
    found += _identity(cfg, account)
    jobs = _jobs(cfg, ctx, backend)
    pods = [(step, job["template"]["spec"]) for step, job in jobs]
    found += _nodes(core, pods)
    images: dict[str, list[str]] = {}
    for step, pod in pods:
        images.setdefault(pod["containers"][0]["image"], []).append(step)
    puller = ("the nodes' kubelet (GKE: the node pool's service account; EKS: the node role)"
              + (f" with image_pull_secrets {', '.join(cfg.image_pull_secrets)}"
                 if cfg.image_pull_secrets else ""))
    found += image_registry.checks(cfg, {i: ", ".join(s) for i, s in images.items()}, puller)
    found.append(gpu_quota.check(cfg, core, jobs))
    return found


def _jobs(cfg: RunConfig, ctx: RunContext, backend) -> list[tuple[str, dict]]:
    """(step, Job spec) of every Job the run's steps would create, as the dry run renders."""
    found = []
    for step in WORKER_STEPS:
        for obj in backend.render(cfg, ctx, step_spec(cfg, step, ctx.run_uri)):
            if obj["kind"] == "Job":
                found.append((step, obj["spec"]))
    return found


def _refusal(err) -> str:
    return f"{err.status} {err.reason}"


def _namespace(core, cfg: RunConfig) -> Check:
    from kubernetes.client import ApiException

    ns = cfg.k8s_namespace
    what = f"namespace {ns} exists"
    try:
        core.read_namespace(ns)
    except ApiException as err:
        if err.status == 404:
            return Check(AREA, what, False, (
                f"Kubernetes: k8s_namespace {ns} does not exist (create it: kubectl create "
                f"namespace {ns}; or set k8s_namespace to the workers' namespace)"))
        return not_checked(AREA, what, f"the caller may not read namespaces "
                                       f"({_refusal(err)}); grant it {READER_RBAC}")
    return Check(AREA, what, True)


def _service_account(core, cfg: RunConfig):
    """(the ServiceAccount's annotations or None when unread, its Check)."""
    from kubernetes.client import ApiException

    name = cfg.service_account or "default"
    ns = cfg.k8s_namespace
    what = f"ServiceAccount {name} exists in namespace {ns}"
    try:
        account = core.read_namespaced_service_account(name, ns)
    except ApiException as err:
        if err.status == 404:
            return None, Check(AREA, what, False, (
                f"Kubernetes: service_account {name} does not exist in namespace {ns} (create "
                f"it: kubectl create serviceaccount {name} -n {ns}, with the annotation that "
                f"binds it to a cloud identity; or set service_account; {DOCS})"))
        return None, not_checked(AREA, what, f"the caller may not read it ({_refusal(err)}); "
                                             f"grant it {READER_RBAC}")
    return (account.metadata.annotations or {}), Check(AREA, what, True)


def _identity(cfg: RunConfig, annotations: dict | None) -> list[Check]:
    """The buckets' side of the pods' identity, by platform and annotation."""
    name, ns = cfg.service_account or "default", cfg.k8s_namespace
    found: list[Check] = []
    for scheme, conn in (("gs", cfg.gcp_conn_id), ("s3", cfg.aws_conn_id)):
        if not bucket_access.places(cfg, scheme):
            continue
        what = f"the pods' access to {scheme}:// folders"
        if conn:
            found.append(Check(bucket_access.AREA, what, True, (
                f"the pods use connection {conn} from the run's Secret: the caller's own key, "
                f"which the bucket probe tried")))
        elif annotations is None:
            found.append(not_checked(bucket_access.AREA, what, (
                f"ServiceAccount {name} was not read, so its cloud identity is unknown")))
        elif scheme == "gs":
            found += _google(cfg, annotations, name, ns, what)
        else:
            found += _aws(cfg, annotations, name, ns, what)
    return found


def _google(cfg: RunConfig, annotations: dict, name: str, ns: str, what: str) -> list[Check]:
    account = annotations.get(GKE_SA_ANNOTATION)
    if account:
        who = f"{account} (annotation {GKE_SA_ANNOTATION} of ServiceAccount {name})"
        return bucket_access.gcs_checks(cfg, [f"serviceAccount:{account}"], who,
                                        account=account) + [
            not_checked(bucket_access.AREA, f"{name} may act as {account}", (
                f"the Google service account's IAM policy must give "
                f"serviceAccount:PROJECT.svc.id.goog[{ns}/{name}] roles/iam.workloadIdentityUser, "
                f"and the node pool must run the GKE metadata server; preflight does not read "
                f"them; {DOCS}"))]
    if cfg.k8s_platform != "gke":
        return [not_checked(bucket_access.AREA, what, (
            f"ServiceAccount {name} has no {GKE_SA_ANNOTATION}; off GKE, gs:// needs "
            f"gcp_conn_id"))]
    who = f"ServiceAccount {ns}/{name} (Workload Identity Federation principal)"
    members = [f"principal://{_WIF}/subject/ns/{ns}/sa/{name}",
               f"principalSet://{_WIF}/namespace/{ns}"]
    return bucket_access.gcs_checks(cfg, members, who)


def _aws(cfg: RunConfig, annotations: dict, name: str, ns: str, what: str) -> list[Check]:
    role = annotations.get(IRSA_ANNOTATION)
    if role:
        who = f"IAM role {role} (annotation {IRSA_ANNOTATION} of ServiceAccount {name})"
        return bucket_access.s3_checks(cfg, role, who)
    return [not_checked(bucket_access.AREA, what, (
        f"ServiceAccount {ns}/{name} has no {IRSA_ANNOTATION}: the pods get an EKS Pod "
        f"Identity association (kept in the EKS API, not on the ServiceAccount) or the node "
        f"role, neither of which preflight reads; annotate it with an IAM role (IRSA) or set "
        f"aws_conn_id; {DOCS}"))]


def _nodes(core, jobs: list[tuple[str, dict]]) -> list[Check]:
    from kubernetes.client import ApiException

    selectors: dict[str, list[str]] = {}
    for step, pod in jobs:
        if pod.get("nodeSelector"):
            selectors.setdefault(render.selector(pod["nodeSelector"]), []).append(step)
    found = []
    for selector, steps in selectors.items():
        what = f"nodes with {selector} ({', '.join(dict.fromkeys(steps))})"
        try:
            nodes = core.list_node(label_selector=selector, limit=1).items
        except ApiException as err:
            found.append(not_checked(AREA, what, f"the caller may not list nodes "
                                                 f"({_refusal(err)}); grant it {READER_RBAC}"))
            continue
        if nodes:
            found.append(Check(AREA, what, True))
        else:
            found.append(not_checked(AREA, what, (
                f"no node has these labels now. A node pool scaled to zero, GKE node "
                f"auto-provisioning or Karpenter adds such nodes when pods wait, which "
                f"preflight cannot tell from a missing pool: check that a pool with labels "
                f"{selector} exists (gcloud container node-pools list; eksctl get nodegroup), "
                f"else the pods stay Pending until schedule_timeout_seconds")))
    return found
