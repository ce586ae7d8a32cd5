"""The workers' side of preflight shared by the Google-run backends (vertex_ai, tpu_vm): the
Google service account the workers run as may read the data and write the artifact root
(tasks/provision/bucket_access.py, from the buckets' IAM policies). Kubernetes finds its
workers' identity on the ServiceAccount (tasks/provision/kubernetes/cluster_preflight.py).
"""
from __future__ import annotations

from tasks.config import RunConfig
from tasks.provision import bucket_access
from tasks.provision.preflight import OBJECT_ROLE, Check, not_checked

# Who runs the workers when service_account is empty, by the platforms' docs:
DEFAULT_ACCOUNTS = {
    # Vertex AI, "Use a custom service account": by default the Vertex AI Custom Code Service
    # Agent of the project.
    "vertex_ai": "the Vertex AI Custom Code Service Agent "
                 "(service-PROJECT_NUMBER@gcp-sa-aiplatform-cc.iam.gserviceaccount.com)",
    # Cloud TPU API Node.serviceAccount: "If not specified, the Compute Engine default service
    # account will be used."
    "tpu_vm": "the Compute Engine default service account "
              "(PROJECT_NUMBER-compute@developer.gserviceaccount.com)",
}


# The folders each backend's workers use: TPU VMs run train and evaluate only (data, tokenize
# and export run on the Airflow worker, tasks/provision/tpu_vm/backend.py); Vertex AI jobs run
# every step.
USED = {"vertex_ai": (), "tpu_vm": ("artifact_root",)}


def service_account_checks(cfg: RunConfig) -> list[Check]:
    only = USED[cfg.provisioner]
    scheme_s3 = bucket_access.places(cfg, "s3", only)
    found: list[Check] = []
    if scheme_s3:
        found.append(not_checked(bucket_access.AREA, "workers' access to s3:// folders", (
            f"{cfg.provisioner} workers run with a Google identity; "
            f"{', '.join(p.label for p in scheme_s3)} on S3 reach them only through the run's "
            f"aws_conn_id connection, whose rights the caller's S3 probe covers")))
    if not bucket_access.places(cfg, "gs", only):
        return found
    if not cfg.service_account:
        return found + [not_checked(bucket_access.AREA, "workers' access to the buckets", (
            f"no service_account: the workers run as {DEFAULT_ACCOUNTS[cfg.provisioner]}, "
            f"whose project number preflight does not look up; grant it {OBJECT_ROLE} on "
            f"the buckets, or set service_account to have it checked"))]
    who = f"service_account {cfg.service_account}"
    return found + bucket_access.gcs_checks(cfg, [f"serviceAccount:{cfg.service_account}"], who,
                                            only, account=cfg.service_account)
