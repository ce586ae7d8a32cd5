"""bert_finetune: validate -> data -> tokenize -> [provision] train -> evaluate [release]
-> export -> gate_eval -> gate -> [approval] -> promote.

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
After export: gate_eval (the candidate and the champion scored on the same test rows) ->
gate (the quality gate's decision) -> approval (a person approves, only with
require_approval and when the gate passed; skipped otherwise) -> promote.
"""
from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import Param, dag, task

from bertflow_airflow import run_tasks
from bertflow_airflow.timetables import BackfillOnlyTimetable
from bertflow_airflow.worker_operator import WorkerStepOperator
from tasks.params_form import param_schemas  # pydantic only; no TensorFlow

DAG_ID = "bert_finetune"
PROMOTED = run_tasks.PROMOTED


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
        from tasks.config import parse_config
        from tasks.runs.runlayout import init_run

        cfg = parse_config(run_tasks.run_values(context))
        return init_run(*run_tasks.checked_run(context, cfg))

    run_uri = validate()
    # The data step streams the inputs in a worker process (`python -m tasks data`), under
    # the same controller as tokenize: this task process never holds the data.
    data_manifest = WorkerStepOperator(task_id="prepare_data", step="data", run_uri=run_uri)
    tokenized = WorkerStepOperator(task_id="tokenize", step="tokenize", run_uri=run_uri)
    provisioned = run_tasks.provision(run_uri)
    trained = WorkerStepOperator(task_id="train", step="train", run_uri=run_uri,
                                 distributed=True)
    evaluated = WorkerStepOperator(task_id="evaluate", step="evaluate", run_uri=run_uri,
                                   distributed=True)
    released = run_tasks.release(run_uri)
    exported = WorkerStepOperator(task_id="export", step="export", run_uri=run_uri)

    data_manifest >> tokenized >> provisioned >> trained >> evaluated >> released
    released.as_teardown(setups=provisioned)
    # export needs evaluate's success explicitly: a teardown succeeds even when its work failed.
    [evaluated, released] >> exported
    run_tasks.gate_approve_promote(run_uri, exported.output)


bert_finetune()
