"""The Airflow tasks that bert_finetune and bert_sweep share: the run's checks before any
compute, provision and release around the workers, and gate_eval -> gate -> approval ->
promote.

Imported by DAG files at parse time: nothing heavy at module level (the tasks package and
TensorFlow-free checks are imported inside the task functions).
"""
from __future__ import annotations

from airflow.sdk import Asset, AssetAlias, get_current_context, task

from bertflow_airflow.approval import CandidateApproval
from bertflow_airflow.worker_operator import WorkerStepOperator, load_run

PROMOTED = AssetAlias("bertflow-promoted-model")


def promoted_asset_name(model_name: str) -> str:
    """The asset a promotion of model_name emits through PROMOTED."""
    return f"bertflow-model-{model_name}"

# A mapped task's label in the grid and logs (a sweep's trial values); unmapped tasks ignore it.
LABEL_TEMPLATE = "{{ bertflow_label }}"


def label_map_index(label: str) -> None:
    """Name this mapped task instance `label` (rendered through LABEL_TEMPLATE)."""
    if label:
        get_current_context()["bertflow_label"] = label


def run_values(context, exclude: tuple[str, ...] = ()) -> dict:
    """The run's Params with date placeholders resolved ({ds}, {logical_date:FMT}, ...):
    the run records only the resolved URIs."""
    from tasks.io import uri_templates

    dag_run = context["dag_run"]
    logical = dag_run.logical_date
    dates = uri_templates.RunDates(
        logical, dag_run.data_interval_start or logical,
        dag_run.data_interval_end or logical) if logical else None
    values = {k: v for k, v in dict(context["params"]).items() if k not in exclude}
    return uri_templates.resolve(values, dates)


def checked_run(context, cfg):
    """Check what can fail cheaply before any compute (inputs, checkpoint, memory, capacity,
    backend; tasks/steps/validate.py, which the command line runs too) and return
    (cfg, RunContext) of the run folder to create. Sets cfg.base_model to the pinned or
    staged checkpoint every step then starts from."""
    from tasks.steps import validate
    from tasks.runs.runlayout import RunContext, run_key_for

    dag_run = context["dag_run"]
    cfg = validate.check_inputs_and_model(cfg)
    if cfg.mlflow_tracking_uri and cfg.mlflow_conn_id:
        from tasks.tracking import mlflow_log

        mlflow_log.credentials(cfg)  # a connection that is missing or empty fails here
    run_type = getattr(dag_run.run_type, "value", dag_run.run_type)
    logical = dag_run.logical_date
    iso = logical.isoformat() if logical else None
    ctx = RunContext(artifact_root=cfg.artifact_root, dag_id=dag_run.dag_id,
                     run_key=run_key_for(run_type, iso, dag_run.run_id, cfg.experiment),
                     run_id=dag_run.run_id, experiment=cfg.experiment, logical_date=iso or "")
    return validate.check_backend(cfg, ctx), ctx


@task
def provision(run_uri: str, label: str = "") -> str:
    from tasks.steps import provision as provision_step

    label_map_index(label)
    return provision_step.run(*load_run(run_uri))


@task
def release(run_uri: str, label: str = "") -> str:
    from tasks.steps import release as release_step

    label_map_index(label)
    return release_step.run(*load_run(run_uri))


@task
def gate(run_uri: str, export_manifest_uri: str) -> dict:
    """The quality gate's decision and both sides' metrics (the pointer does not move)."""
    from tasks.steps import promote as promote_step

    result = promote_step.check(*load_run(run_uri))
    print(f"gate {'passed' if result['passed'] else 'refused'}: {result['reason']}")
    return result


# One promote at a time across runs (a backfill finishes several together): the first
# event for a new model name makes Airflow create its asset, and two such creations at
# once break the unique (name, uri) index and fail a task that had succeeded (seen on
# Postgres, Airflow 3.3). The gate itself is safe either way (CHAMPION.json is written
# conditionally); serial promotes also record a clean champion history.
# none_failed: after the approval task whether it answered or was skipped.
@task(outlets=[PROMOTED], max_active_tis_per_dag=1, trigger_rule="none_failed")
def promote(run_uri: str, export_manifest_uri: str, **context) -> dict:
    """Champion pointer (gate re-applied, approval honoured); a promoted model becomes an
    asset event consumers can schedule on, with the version's lineage as its extra."""
    from tasks.io.uris import join_uri
    from tasks.io import storage
    from tasks.runs import lineage
    from tasks.steps import promote as promote_step

    cfg, ctx = load_run(run_uri)
    answer = context["ti"].xcom_pull(task_ids="approval")  # None when skipped
    approval = promote_step.Approval(**answer) if answer else None
    result = storage.read_json(promote_step.run(cfg, ctx, approval))
    print(f"{'promoted' if result['promoted'] else 'not promoted'}: {result['reason']}")
    if result["promoted"]:
        exported = storage.read_json(export_manifest_uri)
        location = join_uri(cfg.resolved_export_uri(), cfg.model_name)
        uri = location if "://" in location else "file://" + location
        context["outlet_events"][PROMOTED].add(
            Asset(name=promoted_asset_name(cfg.model_name), uri=uri),
            extra={**(lineage.read(exported["version_uri"]) or {}),
                   "version_uri": exported["version_uri"], "version": exported["version"]})
    return result


@task
def log_to_mlflow(run_uri: str, export_manifest_uri: str) -> dict | None:
    """The run and its exported version in MLflow (mlflow_tracking_uri; None when off). Here,
    in the controller, not in a worker: it only reads the run folder and talks HTTP, and the
    tracker's credentials stay in this process. A server that is down or refuses the
    credentials leaves a warning and a failed record (the run page shows it), not a failed
    task."""
    from tasks.tracking import mlflow_log

    return mlflow_log.log_run(*load_run(run_uri))


def gate_approve_promote(run_uri, export_manifest_uri) -> None:
    """gate_eval (the candidate and the champion scored on the same test rows, in a worker)
    -> gate -> approval (a person, only with require_approval and a passed gate; skipped
    otherwise) -> promote, for the run folder that exported the candidate; log_to_mlflow
    beside them, before promote."""
    compared = WorkerStepOperator(task_id="gate_eval", step="gate_eval", run_uri=run_uri)
    gated = gate(run_uri, export_manifest_uri)
    approval = CandidateApproval(task_id="approval", gate_task_id="gate")
    promoted = promote(run_uri, export_manifest_uri)
    export_manifest_uri >> compared >> gated >> approval >> promoted
    # Beside the gate; before promote, which moves the registered version's champion alias.
    log_to_mlflow(run_uri, export_manifest_uri) >> promoted
