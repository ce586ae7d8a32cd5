"""bertflow_janitor: remove remote workers that runs which are no longer running left behind.

Every run's `release` teardown deletes its own Kubernetes objects, Vertex AI jobs and TPU VMs.
This sweep catches what a lost teardown left: an Airflow worker killed mid-run, a deleted DAG
run. Each backend sweeps only objects labelled as bertflow's and leaves running work alone
(tasks/provision/: Kubernetes objects whose Jobs have finished or are gone, Vertex AI jobs
past worker_timeout_minutes, TPU queued resources past their TTL).

The Params locate the resources (backend, namespace, project, region, zone, connections);
their defaults come from the JSON in BERTFLOW_JANITOR_CONF, e.g.
`{"provisioner": "kubernetes", "k8s_namespace": "ml"}`, so a scheduled sweep needs no form.
Schedule: BERTFLOW_JANITOR_SCHEDULE (default @hourly); manual when set to "none".
"""
from __future__ import annotations

import json
import os
from datetime import datetime

from airflow.sdk import Param, dag, task

from tasks.params_form import param_schemas  # pydantic only; no TensorFlow

# The RunConfig fields that say where a backend's resources live.
LOCATING_FIELDS = ("provisioner", "k8s_conn_id", "k8s_namespace", "gcp_conn_id", "aws_conn_id",
                   "gcp_project", "gcp_region", "tpu_project", "tpu_zone",
                   "worker_timeout_minutes")


def _params() -> dict[str, Param]:
    overrides = json.loads(os.environ.get("BERTFLOW_JANITOR_CONF") or "{}")
    schemas = param_schemas()
    params = {}
    for name in LOCATING_FIELDS:
        schema = dict(schemas[name])
        schema["default"] = overrides.get(name, schema["default"])
        params[name] = Param(**schema)
    return params


_schedule = os.environ.get("BERTFLOW_JANITOR_SCHEDULE", "@hourly")


@dag(dag_id="bertflow_janitor", schedule=None if _schedule == "none" else _schedule,
     start_date=datetime(2024, 1, 1), catchup=False, max_active_runs=1, params=_params(),
     tags=["bertflow"], doc_md=__doc__)
def bertflow_janitor():
    @task(retries=0)
    def sweep(**context) -> dict:
        from tasks.config import parse_config
        from tasks.provision.backends import backend_for

        cfg = parse_config(dict(context["params"]))
        removed = backend_for(cfg).sweep(cfg, log=print)
        return {"provisioner": cfg.provisioner, "removed": removed}

    sweep()


bertflow_janitor()
