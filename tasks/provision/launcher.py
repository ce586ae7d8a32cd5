"""A worker's TF_CONFIG, built from what its platform tells it.

`python -m tasks <step>` calls `apply(os.environ)` before the step runs:

- Kubernetes pods (tasks/provision/kubernetes/backend.py) carry their role and the cluster's addresses
  in `BERTFLOW_TF_ROLE` / `BERTFLOW_TF_CLUSTER`, the same for every pod of a role's Indexed Job,
  and Kubernetes sets `JOB_COMPLETION_INDEX` per pod. The TF_CONFIG is built here, so no
  rendered object spells one out by hand.
- Vertex AI writes TF_CONFIG itself (roles chief / worker / ps, `"environment": "cloud"`),
  and the local backend sets it per process: both are taken as they are.
- A TF_CONFIG that describes a single task (Vertex AI sets one even for a one-replica job) is
  dropped: single-process strategies must not see a cluster.

Pure Python: no TensorFlow is imported here.
"""
from __future__ import annotations

import json
from typing import MutableMapping

from tasks.errors import BertflowError

ROLE_ENV = "BERTFLOW_TF_ROLE"
CLUSTER_ENV = "BERTFLOW_TF_CLUSTER"
INDEX_ENV = "JOB_COMPLETION_INDEX"
ROLES = ("chief", "worker", "ps")


def tf_config_for(role: str, index: int, cluster: dict[str, list[str]]) -> str:
    """The TF_CONFIG of task `role:index` in `cluster`, checked against it."""
    if role not in ROLES:
        raise BertflowError(f"{ROLE_ENV}={role!r}: expected one of {', '.join(ROLES)}")
    addresses = cluster.get(role) or []
    if not 0 <= index < len(addresses):
        raise BertflowError(f"task {role}:{index} is not in the cluster {cluster} "
                            f"({INDEX_ENV} out of range)")
    return json.dumps({"cluster": cluster, "task": {"type": role, "index": index}})


def apply(environ: MutableMapping[str, str]) -> str | None:
    """Set (or drop) TF_CONFIG in `environ` as described above; returns what is set."""
    role = environ.get(ROLE_ENV)
    if role:
        try:
            cluster = json.loads(environ.get(CLUSTER_ENV) or "")
            index = int(environ.get(INDEX_ENV, "0"))
        except ValueError as err:
            raise BertflowError(f"{CLUSTER_ENV} / {INDEX_ENV} unreadable ({err}); the "
                                "worker's pod spec is not one bertflow rendered") from None
        environ["TF_CONFIG"] = tf_config_for(role, index, cluster)
    elif environ.get("TF_CONFIG"):
        try:
            cluster = json.loads(environ["TF_CONFIG"]).get("cluster") or {}
        except ValueError as err:
            raise BertflowError(f"TF_CONFIG is not JSON ({err})") from None
        if sum(len(v) for v in cluster.values()) <= 1:
            del environ["TF_CONFIG"]
    return environ.get("TF_CONFIG")
