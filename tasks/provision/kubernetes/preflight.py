"""The Kubernetes part of preflight (tasks/provision/preflight.py): may the run's identity do
what the backend will do? One SelfSubjectAccessReview (authorization.k8s.io/v1) per verb and
resource in ACCESS. Then the workers' side: namespace, ServiceAccount and its cloud identity,
nodes, images (tasks/provision/kubernetes/cluster_preflight.py)."""
from __future__ import annotations

from tasks.config import RunConfig
from tasks.provision.kubernetes import cluster_preflight
from tasks.provision.preflight import DOCS, Check
from tasks.runs.runlayout import RunContext

# (apiGroup, resource, subresource, verbs): every call tasks/provision/kubernetes/backend.py makes
# (create/list/delete of Jobs, Services and Secrets; list/get/delete of pods; their logs).
ACCESS = (
    ("batch", "jobs", "", ("create", "list", "delete")),
    ("", "services", "", ("create", "list", "delete")),
    ("", "secrets", "", ("create", "list", "delete")),
    ("", "pods", "", ("get", "list", "delete")),
    ("", "pods", "log", ("get",)),
)


def checks(cfg: RunConfig, ctx: RunContext, backend) -> list[Check]:
    """`backend`: the KubernetesBackend, whose client the reviews go through."""
    from kubernetes import client

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
    found = []
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
                return found + [Check(
                    "kubernetes", "SelfSubjectAccessReview", False,
                    f"Kubernetes: cannot ask the API server what {who} may do "
                    f"({err.status} {err.reason}); every authenticated user may create "
                    f"selfsubjectaccessreviews.authorization.k8s.io unless the cluster "
                    f"removed that; {DOCS}")]
            except Exception as err:  # noqa: BLE001 (unreachable server)
                return found + [Check("kubernetes", "reach the API server", False,
                                       f"Kubernetes: the API server does not answer: "
                                       f"{str(err).splitlines()[0][:200]}")]
            if not status.allowed:
                denied.append(verb)
        what = f"{', '.join(verbs)} {full} in namespace {ns}"
        if denied:
            group_text = group or '"" (core)'
            found.append(Check("kubernetes", what, False, (
                f"Kubernetes: cannot {', '.join(denied)} {full} in namespace {ns} (grant "
                f"{who} a Role with verbs [{', '.join(denied)}] on {name} in apiGroup "
                f"{group_text}; {DOCS})")))
        else:
            found.append(Check("kubernetes", what, True))
    return found + cluster_preflight.checks(cfg, ctx, backend)
