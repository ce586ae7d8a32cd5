"""bert_batch_score: validate -> score -> publish [release]. Puts the champion to work.

Scores text files with a model version's SavedModel (the champion by default) in worker
processes (the same worker spec and backends as training; local processes by default), one
output row per input row, published under {output_uri}/{run}/ with _COMPLETE.json
(docs/scoring.md). Thin wiring only: the work is tasks/scoring/ and tasks/steps/score.py.

Scheduled on a new champion (the "bertflow-promoted-model" alias bert_finetune's promote
emits: re-score the configured input_uri with the version the event names; another
model_name's promotion skips) and on the "bertflow-scoring-data" asset (its
event's extra input_uri names the data to score); triggerable with a form; backfills over
@daily intervals resolve {ds} in input_uri and output_uri. Publishing emits a
"bertflow-scores" asset event whose extra names the output. release, a teardown as in
bert_finetune, runs whatever score did: it kills workers a dead controller left and removes
their scratch folders, Kubernetes objects or Vertex AI job.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import Param, dag
from airflow.sdk.definitions.timetables.assets import AssetOrTimeSchedule

from bertflow_airflow.run_tasks import PROMOTED, release
from bertflow_airflow.timetables import BackfillOnlyTimetable
from bertflow_airflow.scoring import (DAG_ID, SCORING_DATA, ScoreWorkersOperator, publish,
                                      validate)
from tasks.params_form import score_param_schemas  # pydantic only; no TensorFlow


@dag(
    dag_id=DAG_ID,
    # A new champion or new data runs it; the @daily intervals serve backfills only.
    schedule=AssetOrTimeSchedule(timetable=BackfillOnlyTimetable("@daily", timezone="UTC"),
                                 assets=PROMOTED | SCORING_DATA),
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,  # local workers share one machine's cores
    params={name: Param(**schema) for name, schema in score_param_schemas().items()},
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30)},
    tags=["bertflow", "tensorflow", "scoring"],
    doc_md=__doc__,
)
def bert_batch_score():
    run_uri = validate()
    scored = ScoreWorkersOperator(task_id="score", step="score", run_uri=run_uri)
    publish(run_uri, scored.output)
    # validate made the run folder the workers' records and scratch belong to: its setup.
    scored >> release(run_uri).as_teardown(setups=run_uri)


bert_batch_score()
