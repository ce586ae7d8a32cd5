"""bert_finetune: validate -> data -> tokenize -> [provision] train -> evaluate [release]
-> export -> gate -> [approval] -> promote.

Thin wiring only: every step is `tasks.<step>.run(cfg, ctx)`. Steps that read the data or
import TensorFlow (data, tokenize, train, evaluate, export) run as `python -m tasks <step>`
worker processes started and watched by a controller task; the Airflow task process never
imports TensorFlow nor holds the data, and this file imports nothing heavy at parse time.
Tasks pass run-folder / manifest URIs through XCom.

Schedule: by default no run of its own, but backfills over @daily data intervals from the
UI's Backfill form or `airflow backfill create` (bertflow_airflow/timetables.py); set
BERTFLOW_SCHEDULE (a cron expression or preset such as "@weekly") for scheduled retraining
(and backfills over its intervals); runs get real data intervals. Scheduled and backfill runs
are keyed by experiment and logical date, so `airflow backfill create --dag-id bert_finetune
--from-date ... --to-date ...` writes one run folder per date and re-running a date of an
experiment reuses it (and the tokenized-data cache). Data URIs may name the run's date:
`gs://bucket/reviews/{ds}/*.jsonl`.
Promoted models are asset events on the alias "bertflow-promoted-model" (schedule on it to
react to a new champion); the event's extra holds the version's lineage.
After export: gate (the quality gate's decision) -> approval (a person approves, only with
require_approval and when the gate passed; skipped otherwise) -> promote.
"""
from __future__ import annotations

import os
import sys
from datetime import datetime, timedelta
from pathlib import Path

# The pipeline package lives next to dags/; images put it on PYTHONPATH, a checkout may not.
_PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)
if _PROJECT_ROOT not in sys.path:
    sys.path.insert(0, _PROJECT_ROOT)

from airflow.sdk import Asset, AssetAlias, Param, dag, task  # noqa: E402

from bertflow_airflow.approval import CandidateApproval  # noqa: E402
from bertflow_airflow.timetables import BackfillOnlyTimetable  # noqa: E402
from bertflow_airflow.worker_operator import WorkerStepOperator, load_run  # noqa: E402
from tasks.config import param_schemas  # noqa: E402  (pydantic only; no TensorFlow)

DAG_ID = "bert_finetune"
PROMOTED = AssetAlias("bertflow-promoted-model")


def _schedule():
    """BERTFLOW_SCHEDULE (a cron expression or preset such as @weekly), the one place the
    schedule is set, as a data-interval timetable: each scheduled or backfill run covers
    [previous tick, this tick), which date placeholders such as {data_interval_start:%Y-%m-%d}
    resolve from. Unset: @daily intervals for backfills only, never a run by itself (the UI's
    Backfill option needs a periodic timetable). catchup stays off; backfills fill history."""
    from airflow.sdk.definitions.timetables.interval import CronDataIntervalTimetable

    expression = os.environ.get("BERTFLOW_SCHEDULE")
    if expression:
        return CronDataIntervalTimetable(expression, timezone="UTC")
    return BackfillOnlyTimetable("@daily", timezone="UTC")


@dag(
    dag_id=DAG_ID,
    schedule=_schedule(),
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,  # local workers share one machine's cores
    params={name: Param(**schema) for name, schema in param_schemas().items()},
    # One retry for transient worker failures (a killed pod, a port race).
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30)},
    tags=["bertflow", "tensorflow"],
    doc_md=__doc__,
)
def bert_finetune():
    @task(retries=0)  # a bad config or missing file will not fix itself
    def validate(**context) -> str:
        """Parse the Params (field errors fail here), check the inputs, create the run
        folder."""
        from tasks.steps import data
        from tasks.io import storage, uri_templates
        from tasks.provision import memory_budget
        from tasks.training import checkpoint_sources, hub_staging, memory
        from tasks.provision import backend_for
        from tasks.config import parse_config
        from tasks.runs.runlayout import RunContext, init_run, run_key_for

        dag_run = context["dag_run"]
        logical = dag_run.logical_date
        dates = uri_templates.RunDates(
            logical, dag_run.data_interval_start or logical,
            dag_run.data_interval_end or logical) if logical else None
        # Date placeholders resolve here; the run records only the resolved URIs.
        values = uri_templates.resolve(dict(context["params"]), dates)
        cfg = parse_config(values)
        storage.configure(storage.Connections(cfg.gcp_conn_id, cfg.aws_conn_id))
        data.check_inputs(cfg)
        # Exists, has the files loading needs, is a BERT (config.json and a listing only);
        # a champion is pinned to its version, so every step starts from the same weights.
        cfg.base_model = checkpoint_sources.check(cfg)
        # A batch that would not fit the workers' memory, from the checkpoint's config.json.
        memory_budget.check_config(cfg, memory.readable_config(cfg))
        backend = backend_for(cfg)
        run_type = getattr(dag_run.run_type, "value", dag_run.run_type)
        iso = logical.isoformat() if logical else None
        ctx = RunContext(artifact_root=cfg.artifact_root, dag_id=dag_run.dag_id,
                         run_key=run_key_for(run_type, iso, dag_run.run_id, cfg.experiment),
                         run_id=dag_run.run_id, experiment=cfg.experiment,
                         logical_date=iso or "")
        backend.check(cfg, ctx)  # e.g. remote workers need a gs:// or s3:// run folder
        if not backend.receives_connections:  # a gated Hub repo: the token stays here
            cfg.base_model = hub_staging.stage_for_workers(cfg)
        return init_run(cfg, ctx)

    @task
    def provision(run_uri: str) -> str:
        from tasks import provision as provision_step

        return provision_step.run(*load_run(run_uri))

    @task
    def release(run_uri: str) -> str:
        from tasks.provision import release as release_step

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
        from tasks.steps import promote as promote_step
        from tasks.io import storage
        from tasks.config import join_uri
        from tasks.runs import lineage

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
                Asset(name=f"bertflow-model-{cfg.model_name}", uri=uri),
                extra={**(lineage.read(exported["version_uri"]) or {}),
                       "version_uri": exported["version_uri"], "version": exported["version"]})
        return result

    run_uri = validate()
    # The data step streams the inputs in a worker process (`python -m tasks data`), under
    # the same controller as tokenize: this task process never holds the data.
    data_manifest = WorkerStepOperator(task_id="prepare_data", step="data", run_uri=run_uri)
    tokenized = WorkerStepOperator(task_id="tokenize", step="tokenize", run_uri=run_uri)
    provisioned = provision(run_uri)
    trained = WorkerStepOperator(task_id="train", step="train", run_uri=run_uri,
                                 distributed=True)
    evaluated = WorkerStepOperator(task_id="evaluate", step="evaluate", run_uri=run_uri,
                                   distributed=True)
    released = release(run_uri)
    exported = WorkerStepOperator(task_id="export", step="export", run_uri=run_uri)

    data_manifest >> tokenized >> provisioned >> trained >> evaluated >> released
    released.as_teardown(setups=provisioned)
    # export needs evaluate's success explicitly: a teardown succeeds even when its work failed.
    [evaluated, released] >> exported
    gated = gate(run_uri, exported.output)
    approval = CandidateApproval(task_id="approval", gate_task_id="gate")
    gated >> approval >> promote(run_uri, exported.output)


bert_finetune()
