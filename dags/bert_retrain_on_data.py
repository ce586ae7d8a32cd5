"""bert_retrain_on_data: retrain `bert_finetune` whenever new training data is announced.

Scheduled on the asset `bertflow-training-data`. A producer announces data with an asset
event whose extra names it: `{"train_uri": "s3://bucket/reviews/2024-06-01/"}` (a file, a
prefix ending in `/` or a glob, as `train_uri` takes them) and optionally `"test_uri"` (or its
former name `"eval_uri"`) and `"validation_uri"`; without a test file, bert_finetune holds out
a split of the new data rather than evaluating on its default evaluation file. Every other setting is bert_finetune's default. When several events arrive
before a run starts, the newest one wins.

Producers:
- a DAG task: `@task(outlets=[TRAINING_DATA])` (import it from this file, or declare
  `Asset("bertflow-training-data", uri="bertflow://training-data")`) that sets
  `context["outlet_events"][TRAINING_DATA].extra = {"train_uri": uri}`;
- the REST API: `POST /api/v2/assets/events` with
  `{"asset_id": ID, "extra": {"train_uri": "gs://bucket/data/part-*.csv"}}`, where ID comes
  from `GET /api/v2/assets?name_pattern=bertflow-training-data`.
"""
from __future__ import annotations

from datetime import datetime

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import Asset, dag, task

TRAINING_DATA = Asset("bertflow-training-data", uri="bertflow://training-data")
TARGET_DAG_ID = "bert_finetune"


@dag(dag_id="bert_retrain_on_data", schedule=[TRAINING_DATA], start_date=datetime(2024, 1, 1),
     catchup=False, tags=["bertflow"], doc_md=__doc__)
def bert_retrain_on_data():
    @task(retries=0)  # an event without a data URI will not grow one
    def data_conf(**context) -> dict:
        """bert_finetune's conf from the newest triggering event."""
        event = max(context["triggering_asset_events"][TRAINING_DATA],
                    key=lambda e: e.timestamp)
        extra = event.extra or {}
        if not extra.get("train_uri"):
            raise ValueError(f"asset event {event.timestamp} of {TRAINING_DATA.name} has no "
                             f"'train_uri' in its extra (got keys {sorted(extra)}); see "
                             "this DAG's docs for how to announce data")
        return {"train_uri": extra["train_uri"],
                "test_uri": extra.get("test_uri") or extra.get("eval_uri", ""),
                "validation_uri": extra.get("validation_uri", "")}

    TriggerDagRunOperator(task_id="trigger_bert_finetune", trigger_dag_id=TARGET_DAG_ID,
                          conf=data_conf())


bert_retrain_on_data()
