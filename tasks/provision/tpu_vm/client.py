"""The Cloud TPU API (google-cloud-tpu's tpu_v2 over REST): the client, the project, and
what a queued resource's and node's states say."""
from __future__ import annotations

import os

from tasks.config import RunConfig
from tasks.errors import BertflowError, ConfigError
from tasks.provision.tpu_vm.render import LABEL_RUN

ENDPOINT_ENV = "BERTFLOW_TPU_ENDPOINT"
# Capacity the platform took back, by the state names of google-cloud-tpu's tpu_v2 types
# (QueuedResourceState.State, Node.State). Cloud TPU, "Manage queued resources"
# (cloud.google.com/tpu/docs/queued-resources): a queued resource stays assigned "unless you
# delete it or it's preempted. Only TPU Spot VMs and preemptible TPUs are eligible for
# preemption"; SUSPENDING: its resources are being deleted, SUSPENDED: they were deleted and
# it is "no longer eligible for further allocation". "Preemptible TPUs" (.../preemptible): a
# preempted TPU's status changes from READY to PREEMPTED; Node.State's own docstring adds
# TERMINATED (maintenance, or a preemptible node's end of life). "Manage TPU Spot VMs"
# (.../spot): "You can't restart TPU Spot VMs, and you must recreate them after preemption".
SUSPENDED_STATES = ("SUSPENDING", "SUSPENDED")
GONE_NODE_STATES = ("PREEMPTED", "TERMINATED")


def tpu_client(cfg: RunConfig):
    """(TpuClient over REST, the project its credentials name or None)."""
    from google.cloud import tpu_v2
    from google.cloud.tpu_v2.services.tpu.transports import TpuRestTransport

    endpoint = os.environ.get(ENDPOINT_ENV)
    if endpoint:  # an emulator or a test's fake: no credentials
        from google.auth.credentials import AnonymousCredentials

        scheme, _, host = endpoint.rpartition("://")
        transport = TpuRestTransport(host=host, credentials=AnonymousCredentials(),
                                     url_scheme=scheme or "https")
        return tpu_v2.TpuClient(transport=transport), None
    credentials = project = None
    if cfg.gcp_conn_id:
        from tasks.io.cloud_storage import google_connection

        credentials, project, _ = google_connection(cfg.gcp_conn_id)
    if credentials is None:
        import google.auth

        try:
            credentials, ambient = google.auth.default(
                scopes=["https://www.googleapis.com/auth/cloud-platform"])
        except Exception as err:  # DefaultCredentialsError
            raise BertflowError(f"Cloud TPU: no credentials ({type(err).__name__}); set "
                                "gcp_conn_id or configure application-default "
                                "credentials") from None
        project = project or ambient
    return tpu_v2.TpuClient(credentials=credentials, transport="rest"), project


def resolve_project(cfg: RunConfig, found: str | None) -> str:
    project = cfg.tpu_project or cfg.gcp_project or found
    if not project:
        raise ConfigError("tpu_project", "no Google Cloud project for the TPU: set tpu_project "
                                         "or gcp_project (or the connection's project)")
    return project


def errors():
    from google.api_core import exceptions

    return exceptions


def node_labels(resource) -> dict[str, str]:
    specs = resource.tpu.node_spec
    return dict(specs[0].node.labels) if specs else {}


def run_of(resource) -> str | None:
    return node_labels(resource).get(LABEL_RUN)


def tpu_state(resource, node) -> str:
    """The TPU's states for messages: 'queued resource SUSPENDED (by the service), node
    PREEMPTED'."""
    if resource is None:
        return "queued resource gone"
    state = resource.state
    by = state.state_initiator.name.lower()
    text = f"queued resource {state.state.name}" + (
        f" (by the {by})" if state.state.name in SUSPENDED_STATES and by in ("user", "service")
        else "")
    return f"{text}, node {node.state.name if node is not None else 'gone'}"


def unusable(resource, node) -> bool:
    """Failed, or its capacity is gone: the queued resource must be queued again."""
    return (resource.state.state.name in ("FAILED", *SUSPENDED_STATES)
            or (node is not None and node.state.name in GONE_NODE_STATES))


def taken_back(resource, node) -> bool:
    """The platform reclaimed the spot or preemptible TPU (not a person deleting it)."""
    if resource is None or resource.state.state.name == "FAILED":
        return False
    spot = "spot" in resource or (node is not None and (node.scheduling_config.spot or
                                                        node.scheduling_config.preemptible))
    by_user = resource.state.state_initiator.name == "USER"
    return spot and not by_user and unusable(resource, node)
