"""The Airflow side of bert_batch_score (dags/bert_batch_score.py): the validate task that
checks and plans a scoring run, the controller of its workers, and the publish task that
emits the `bertflow-scores` asset event. Nothing heavy at module level (parse time)."""
from __future__ import annotations

from airflow.sdk import Asset, task

from bertflow_airflow.worker_operator import WorkerStepOperator, load_run
from tasks.runs.run_summary import SCORING_DAG

SCORING_DATA = Asset("bertflow-scoring-data")
SCORES = Asset("bertflow-scores")
DAG_ID = SCORING_DAG  # the bertflow page lists its runs apart


def event_input_uri(context) -> str | None:
    """The input_uri a triggering bertflow-scoring-data event names (the newest), if any."""
    events = context.get("triggering_asset_events") or {}
    named = [event for asset, found in events.items()
             if getattr(asset, "name", None) == SCORING_DATA.name for event in found
             if (event.extra or {}).get("input_uri")]
    if not named:
        return None
    return max(named, key=lambda event: event.timestamp).extra["input_uri"]


@task(retries=0)  # a bad input, model or output will not fix itself
def validate(**context) -> str:
    """Parse the Params, check input columns, model version and output location, plan the
    shards, create the run folder; returns its URI."""
    from bertflow_airflow.run_tasks import run_values
    from tasks.runs.runlayout import RunContext, init_run, run_key_for
    from tasks.score_config import parse_score_config, run_config
    from tasks.scoring.plan import make_plan

    values = dict(context["params"])
    uri = event_input_uri(context)
    if uri:
        print(f"input_uri from the bertflow-scoring-data event: {uri}")
        values["input_uri"] = uri
    context["params"] = values
    cfg = parse_score_config(run_values(context))
    dag_run = context["dag_run"]
    run_type = getattr(dag_run.run_type, "value", dag_run.run_type)
    iso = dag_run.logical_date.isoformat() if dag_run.logical_date else None
    ctx = RunContext(artifact_root=cfg.artifact_root, dag_id=dag_run.dag_id,
                     run_key=run_key_for(run_type, iso, dag_run.run_id, "scores"),
                     run_id=dag_run.run_id, logical_date=iso or "")
    from tasks.provision.backends import backend_for

    workers_cfg = run_config(cfg)
    backend_for(workers_cfg).check(workers_cfg, ctx)  # the backend's own config problems
    run_uri = init_run(workers_cfg, ctx)
    plan = make_plan(cfg, ctx)
    print(f"{plan['rows']} rows in {len(plan['inputs'])} file(s), {len(plan['shards'])} "
          f"shard(s) for {plan['num_workers']} worker(s); model {plan['model']['version']} "
          f"({plan['model']['task']}); output {plan['output_uri']}")
    return run_uri


class ScoreWorkersOperator(WorkerStepOperator):
    """The score step's workers: num_workers independent processes (tasks/steps/score.py) on
    the configured backend, re-provisioned after a preemption or a lost worker."""

    # The bertflow page lists scoring runs on its index, without a run page of their own.
    operator_extra_links = ()

    def worker_spec(self, cfg, ctx):
        from tasks.provision.spec import scoring_spec
        from tasks.scoring.plan import read_plan

        workers = read_plan(ctx)["num_workers"]
        return scoring_spec(self.run_uri, workers, accelerated=cfg.accelerator != "cpu")


@task(outlets=[SCORES])
def publish(run_uri: str, score_manifest_uri: str, **context) -> dict:
    """_COMPLETE.json once every shard is in and the rows add up; then the asset event."""
    from tasks.scoring.publish import publish as publish_scores

    summary = publish_scores(load_run(run_uri)[1])
    print(f"published {summary['rows']} rows ({summary['error_rows']} unreadable) scored by "
          f"{summary['model_version']} to {summary['output_uri']}")
    context["outlet_events"][SCORES].extra = {
        "output_uri": summary["output_uri"], "rows": summary["rows"],
        "error_rows": summary["error_rows"], "model_version": summary["model_version"],
        "version_uri": summary["version_uri"]}
    return summary
