"""Airflow connections for worker processes.

Steps that run as `python -m tasks <step>` processes cannot reach Airflow's metadata DB or its
Task Execution API, so `BaseHook.get_connection` there finds only secrets backends that
need no Airflow server, among them the environment variables `AIRFLOW_CONN_<ID>`. The
controller (the Airflow task process, which can resolve connections) hands the run's
connections over in that form.

`worker_env` returns secrets. Pass it only as the environment of the worker processes when
they start; never log it, put it in a WorkerSpec (the provision manifest is written to disk)
or a manifest, or return it as XCom.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Protocol

from tasks.errors import ConfigError


@dataclass(frozen=True)
class Connections:
    """Airflow connection ids the storage of this process takes credentials from
    (`tasks.io.storage.configure`); empty means ambient credentials."""

    gcp_conn_id: str = ""
    aws_conn_id: str = ""


def env_name(conn_id: str) -> str:
    """The environment variable Airflow reads connection `conn_id` from."""
    return f"AIRFLOW_CONN_{conn_id.upper()}"


def keyless_google_env(conn_id: str, project: str = "") -> dict[str, str]:
    """`gcp_conn_id` for workers that run as a cloud service account (Vertex AI, TPU VMs):
    the connection without a key (project only), so their storage falls back to that
    account's ambient credentials instead of failing to find the connection."""
    if not conn_id:
        return {}
    extra = {"project": project} if project else {}
    return {env_name(conn_id): json.dumps({"conn_type": "google_cloud_platform",
                                           "extra": extra})}


CONNECTION_FIELDS = ("gcp_conn_id", "aws_conn_id", "hf_conn_id")


class ConnectionIds(Protocol):
    """The connection ids of a run's config (tasks.config.RunConfig has these fields): named
    here, so tasks.io reads them without importing tasks.config, which sits above it."""

    gcp_conn_id: str
    aws_conn_id: str
    hf_conn_id: str


def connection_env_names(cfg: ConnectionIds) -> list[str]:
    """The AIRFLOW_CONN_<ID> names worker_env(cfg) sets, without reading any connection."""
    return [env_name(c) for c in (getattr(cfg, f) for f in CONNECTION_FIELDS) if c]


def worker_env(cfg: ConnectionIds) -> dict[str, str]:
    """`{"AIRFLOW_CONN_<ID>": connection as JSON}` for cfg.gcp_conn_id, cfg.aws_conn_id and
    cfg.hf_conn_id (empty ids, meaning ambient credentials, are skipped). Call it in the
    controller."""
    env = {}
    for field in CONNECTION_FIELDS:
        conn_id = getattr(cfg, field)
        if conn_id:
            env[env_name(conn_id)] = connection(field, conn_id).as_json()
    return env


def connection(field: str, conn_id: str):
    """Airflow connection `conn_id` of config field `field` (a ConfigError naming the field
    when it is not defined). Call it in the controller."""
    # Lazy: only controllers with connections configured need the Airflow SDK.
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise ConfigError(field, f"Airflow connection '{conn_id}' is not defined; create "
                                 "it, or leave the field empty for ambient "
                                 "credentials") from None
