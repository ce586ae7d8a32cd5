"""A run in MLflow (`mlflow_tracking_uri`; docs/mlflow.md), from what the steps already wrote.

`log_run` runs after export, in the Airflow task process (the controller), and reads only the
run folder and the exported version: config.json as params, train/history.json as per-step
training and validation metrics, evaluate/metrics.json as the test metrics, the model card,
the confusion matrix and lineage.json as artifacts, the lineage as tags. It then registers the
version under `model_name`. `move_champion` (the promote step) points the `champion` alias at
it. Training workers never import MLflow nor see its credentials, and a run logs the same
whatever backend trained it.

MLflow is optional: with `mlflow_tracking_uri` empty nothing here imports it. A tracking server
that is down, slow or refuses the credentials never fails the run: the step logs one warning
line and records `{"status": "failed", "error"}` in `mlflow/manifest.json` (promote: in its
manifest's "mlflow"), which the bertflow page shows. Credentials come from `mlflow_conn_id` or
MLflow's own environment variables; they are set for the call only and never written anywhere.
"""
from __future__ import annotations

import contextlib
import csv
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from tasks.config import RunConfig
from tasks.errors import ConfigError, StorageError
from tasks.io import storage
from tasks.io.uris import join_uri, redact
from tasks.runs import lineage, runlayout
from tasks.runs.runlayout import RunContext

log = logging.getLogger(__name__)

STEP = "mlflow"                 # {run}/mlflow/manifest.json
CHAMPION_ALIAS = "champion"
RUN_TAG = "bertflow.run_uri"    # finds the run again on a retry
VERSION_TAG = "bertflow.version_uri"
CREDENTIALS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")
# A server that is down costs seconds, not MLflow's default of 7 retries with backoff.
CLIENT_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
              "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
# MLflow's limits per log_batch call and per value.
BATCH_METRICS, BATCH_PARAMS, BATCH_TAGS = 1000, 100, 100
PARAM_CHARS, TAG_CHARS = 6000, 5000
# history.json record keys that are positions, not metrics.
NOT_METRICS = {"step", "epoch", "elapsed_seconds", "seconds"}


def enabled(cfg: RunConfig) -> bool:
    return bool(cfg.mlflow_tracking_uri)


def credentials(cfg: RunConfig) -> dict[str, str]:
    """MLflow's credential variables from `mlflow_conn_id`: login and password are basic
    auth; a password alone or extra {"token"} a bearer token. {} without a connection id
    (MLflow then reads those variables from the environment)."""
    if not cfg.mlflow_conn_id:
        return {}
    from tasks.io.credentials import connection

    conn = connection("mlflow_conn_id", cfg.mlflow_conn_id)
    token = (conn.extra_dejson or {}).get("token")
    if conn.login and conn.password:
        return {"MLFLOW_TRACKING_USERNAME": conn.login, "MLFLOW_TRACKING_PASSWORD": conn.password}
    if token or conn.password:
        return {"MLFLOW_TRACKING_TOKEN": str(token or conn.password)}
    raise ConfigError("mlflow_conn_id", f"Airflow connection '{cfg.mlflow_conn_id}' has no "
                                        "password or token; set login and password, or a "
                                        "token")


@contextlib.contextmanager
def client_env(cfg: RunConfig) -> Iterator[None]:
    """The connection's credentials and short retries in os.environ (where MLflow's REST
    client reads them) for the block only; urllib3's retry warnings kept quiet, so a step
    logs one line."""
    changes: dict[str, str | None] = {k: v for k, v in CLIENT_ENV.items()
                                      if k not in os.environ}  # the operator's own wins
    found = credentials(cfg)
    if found:
        changes.update({k: found.get(k) for k in CREDENTIALS})
    saved = {k: os.environ.get(k) for k in changes}
    retries = logging.getLogger("urllib3.connectionpool")
    level = retries.level
    try:
        for key, value in changes.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        retries.setLevel(logging.ERROR)
        yield
    finally:
        retries.setLevel(level)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _client(cfg: RunConfig):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=cfg.mlflow_tracking_uri,
                        registry_uri=cfg.mlflow_tracking_uri)


def _tracker_errors() -> tuple[type[BaseException], ...]:
    """What a tracking server that is down, slow or refusing raises (MLflow wraps most in
    MlflowException; artifact uploads raise requests' errors). Other exceptions are bugs and
    fail the task."""
    import requests
    from mlflow.exceptions import MlflowException

    return MlflowException, requests.RequestException, ConfigError


def _failed(cfg: RunConfig, what: str, err: BaseException) -> dict[str, Any]:
    reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
    where = redact(cfg.mlflow_tracking_uri)
    log.warning("MLflow: %s failed at %s (%s: %s); the run goes on", what, where,
                type(err).__name__, reason)
    return {"status": "failed", "tracking_uri": where, "error": f"{what}: {reason}"}


def log_run(cfg: RunConfig, ctx: RunContext) -> dict[str, Any] | None:
    """Log the run and register its exported version; the record (also written to
    `mlflow/manifest.json`), or None when MLflow is off. Never raises for the server."""
    if not enabled(cfg):
        return None
    try:
        with client_env(cfg):
            record = _log(cfg, ctx, _client(cfg))
    except _tracker_errors() as err:
        record = _failed(cfg, "logging the run", err)
    runlayout.write_manifest(ctx.step_uri(STEP), record)
    return record


def move_champion(cfg: RunConfig, ctx: RunContext, version_uri: str) -> dict[str, Any] | None:
    """Point the model's `champion` alias at the MLflow version `log_run` registered for
    `version_uri` (promote calls it after moving CHAMPION.json). The record for promote's
    manifest, or None when MLflow is off. Never raises for the server."""
    if not enabled(cfg):
        return None
    logged = _logged(ctx)
    if logged.get("status") != "logged" or logged.get("version_uri") != version_uri:
        error = ("the run was not logged to MLflow (its mlflow step "
                 f"{logged.get('status') or 'did not run'}); the alias stays")
        log.warning("MLflow: %s", error)
        return {"status": "failed", "error": error}
    try:
        with client_env(cfg):
            _client(cfg).set_registered_model_alias(cfg.model_name, CHAMPION_ALIAS,
                                                    logged["model_version"])
    except _tracker_errors() as err:
        return _failed(cfg, f"moving the {CHAMPION_ALIAS} alias", err)
    return {"status": "moved", "alias": CHAMPION_ALIAS, "model_name": cfg.model_name,
            "model_version": logged["model_version"]}


def _logged(ctx: RunContext) -> dict[str, Any]:
    try:
        return runlayout.read_manifest(ctx.manifest_uri(STEP))
    except (StorageError, ValueError):
        return {}


def _log(cfg: RunConfig, ctx: RunContext, client) -> dict[str, Any]:
    exported = runlayout.read_manifest(ctx.manifest_uri("export"))
    version_uri = exported["version_uri"]
    record = lineage.read(version_uri) or {}
    name = ctx.experiment or cfg.experiment
    experiment = client.get_experiment_by_name(name)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
    run = _finished_run(client, experiment_id, ctx)
    if run is None:
        run = client.create_run(experiment_id, run_name=ctx.run_key, tags=_tags(ctx, record))
        run_id = run.info.run_id
        _log_values(client, run_id, cfg, ctx)
        with tempfile.TemporaryDirectory(prefix="bertflow-mlflow-") as tmp:
            client.log_artifacts(run_id, _artifacts(ctx, version_uri, record, Path(tmp)))
        client.set_terminated(run_id)
    version = _register(client, cfg.model_name, exported, run.info.run_id)
    base = cfg.mlflow_tracking_uri.rstrip("/")
    return {"status": "logged", "tracking_uri": redact(cfg.mlflow_tracking_uri),
            "experiment": name, "experiment_id": experiment_id, "run_id": run.info.run_id,
            "run_url": f"{redact(base)}/#/experiments/{experiment_id}/runs/{run.info.run_id}",
            "model_name": cfg.model_name, "model_version": version.version,
            "version": exported["version"], "version_uri": version_uri,
            "source": version.source}


def _finished_run(client, experiment_id: str, ctx: RunContext):
    """The MLflow run a previous attempt logged completely for this run folder, or None (an
    unfinished one is deleted: its metrics would be logged twice)."""
    quoted = ctx.run_uri.replace("\\", "\\\\").replace("'", "\\'")
    for run in client.search_runs([experiment_id], f"tags.`{RUN_TAG}` = '{quoted}'"):
        if run.info.status == "FINISHED":
            return run
        client.delete_run(run.info.run_id)
    return None


def _tags(ctx: RunContext, record: dict[str, Any]) -> dict[str, str]:
    """The run's lineage (tasks/runs/lineage.py) as flat tags; MLflow's own for the code."""
    code = record.get("code") or {}
    base = record.get("base_model") or {}
    tags = {RUN_TAG: ctx.run_uri, "bertflow.dag_id": ctx.dag_id,
            "bertflow.run_id": ctx.run_id, "bertflow.run_key": ctx.run_key,
            "bertflow.logical_date": ctx.logical_date or "",
            "bertflow.version": record.get("version"), VERSION_TAG: record.get("version_uri"),
            "bertflow.model_name": record.get("model_name"),
            "bertflow.tfrecord_cache_key": record.get("tfrecord_cache_key"),
            "bertflow.base_model.source": base.get("source"),
            "bertflow.base_model.revision": base.get("revision"),
            "bertflow.base_model.sha256": base.get("sha256") or base.get("hash"),
            "bertflow.code_version": code.get("bertflow"),
            "mlflow.source.git.commit": code.get("git_commit")}
    for split, src in (record.get("data") or {}).items():
        tags[f"bertflow.data.{split}.uri"] = redact(str(src.get("uri") or ""))
        tags[f"bertflow.data.{split}.sha256"] = src.get("sha256")
    return {k: str(v)[:TAG_CHARS] for k, v in tags.items() if v not in (None, "")}


def _log_values(client, run_id: str, cfg: RunConfig, ctx: RunContext) -> None:
    from mlflow.entities import Metric, Param

    params = [Param(k, _param_value(v)) for k, v in json.loads(cfg.to_json()).items()]
    for i in range(0, len(params), BATCH_PARAMS):
        client.log_batch(run_id, params=params[i:i + BATCH_PARAMS])
    metrics = [Metric(k, v, ts, step) for k, v, ts, step in metric_points(ctx)]
    for i in range(0, len(metrics), BATCH_METRICS):
        client.log_batch(run_id, metrics=metrics[i:i + BATCH_METRICS])


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text[:PARAM_CHARS]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def metric_points(ctx: RunContext) -> list[tuple[str, float, int, int]]:
    """(key, value, timestamp ms, step): train/* per recorded step and validation/* per
    evaluation from train/history.json, test/* from the evaluation at the last step.
    Timestamps count back from now by the history's elapsed seconds (it keeps no clock)."""
    history = _json_or_empty(join_uri(ctx.step_uri("train"), "history.json"))
    records = [r for r in history.get("records") or [] if isinstance(r, dict)]
    now = int(time.time() * 1000)
    end = max([float(r.get("elapsed_seconds") or 0) for r in records] or [0.0])
    points = []
    for r in records:
        at = now - int((end - float(r.get("elapsed_seconds") or end)) * 1000)
        points += [(f"train/{k}", float(v), at, int(r["step"])) for k, v in r.items()
                   if k not in NOT_METRICS and _number(v)]
    for r in history.get("validation") or []:
        points += [(f"validation/{k}", float(v), now, int(r["step"])) for k, v in r.items()
                   if k not in NOT_METRICS and _number(v)]
    last = max([int(r["step"]) for r in records] or [0])
    points += [(f"test/{k}", float(v), now, last) for k, v in _test_metrics(ctx).items()
               if _number(v)]
    return points


def _json_or_empty(uri: str) -> dict[str, Any]:
    try:
        value = storage.read_json(uri)
    except (StorageError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _test_metrics(ctx: RunContext) -> dict[str, Any]:
    evaluation = _json_or_empty(ctx.manifest_uri("evaluate"))
    return _json_or_empty(evaluation["metrics_uri"]) if evaluation.get("metrics_uri") else {}


def _artifacts(ctx: RunContext, version_uri: str, record: dict[str, Any], out: Path) -> str:
    """model_card.md, lineage.json and the evaluation's metrics.json, plus the confusion
    matrix (classification) as confusion_matrix.json and .csv, in `out`."""
    card = join_uri(version_uri, "model_card.md")
    if storage.exists(card):
        (out / "model_card.md").write_text(storage.read_text(card))
    if record:
        (out / lineage.LINEAGE).write_text(json.dumps(record, indent=2))
    metrics = _test_metrics(ctx)
    if metrics:
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    matrix, labels = metrics.get("confusion_matrix"), metrics.get("labels")
    if matrix and labels:
        (out / "confusion_matrix.json").write_text(json.dumps(
            {"labels": labels, "rows": "true label", "columns": "predicted label",
             "matrix": matrix}, indent=2))
        with open(out / "confusion_matrix.csv", "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["true \\ predicted", *labels])
            writer.writerows([label, *row] for label, row in zip(labels, matrix))
    return str(out)


def _register(client, model_name: str, exported: dict[str, Any], run_id: str):
    """The MLflow model version of an exported version, registered once (a retry finds it by
    its tag). Its source is the version URI; MLflow refuses a local path outside the run's
    artifacts, so a version on local disk points at its run (`runs:/{id}`; the model card
    and lineage are there) and keeps its folder in the tag and description."""
    from mlflow.exceptions import MlflowException

    version_uri = exported["version_uri"]
    try:
        client.create_registered_model(model_name, description="Exported by bertflow")
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    quoted = model_name.replace("'", "\\'")
    for found in client.search_model_versions(f"name = '{quoted}'"):
        if found.tags.get(VERSION_TAG) == version_uri:
            return found
    remote = "://" in version_uri and not version_uri.startswith("file://")
    return client.create_model_version(
        model_name, version_uri if remote else f"runs:/{run_id}", run_id=run_id,
        tags={VERSION_TAG: version_uri, "bertflow.version": exported["version"]},
        description=f"bertflow version {exported['version']}: {redact(version_uri)}")
