"""The Airflow side of bert_batch_score (dags/bert_batch_score.py): the validate task that
checks and plans a scoring run, the controller of its workers, and the publish task that
emits the `bertflow-scores` asset event. Nothing heavy at module level (parse time)."""
from __future__ import annotations

from airflow.sdk import Asset, task
from airflow.sdk.exceptions import AirflowSkipException

from bertflow_airflow.worker_operator import WorkerStepOperator, load_run
from tasks.runs.run_summary import SCORING_DAG

SCORING_DATA = Asset("bertflow-scoring-data")
SCORES = Asset("bertflow-scores")
DAG_ID = SCORING_DAG  # the bertflow page lists its runs apart


def _newest_extra(context, asset_name: str, key: str):
    """extra[key] of the newest triggering event of the asset asset_name that has it."""
    events = context.get("triggering_asset_events") or {}
    named = [event for asset, found in events.items()
             if getattr(asset, "name", None) == asset_name for event in found
             if (event.extra or {}).get(key)]
    if not named:
        return None
    return max(named, key=lambda event: event.timestamp).extra[key]


def event_input_uri(context) -> str | None:
    """The input_uri a triggering bertflow-scoring-data event names (the newest), if any."""
    return _newest_extra(context, SCORING_DATA.name, "input_uri")


def promoted_version_uri(context, model_name: str) -> str | None:
    """The version a triggering promotion of model_name made champion (the newest), if any:
    the run scores with the version its event names, not whatever CHAMPION.json says by the
    time its validate runs."""
    from bertflow_airflow.run_tasks import promoted_asset_name

    return _newest_extra(context, promoted_asset_name(model_name), "version_uri")


def other_models_only(context, model_name: str) -> list[str]:
    """The assets of the triggering events when every one is another model's promotion (a
    sweep's model, another team's): nothing of this run's to re-score. Else []."""
    from bertflow_airflow.run_tasks import PROMOTED, promoted_asset_name

    events = context.get("triggering_asset_events") or {}
    names = sorted({asset.name for asset in events if asset.name != PROMOTED.name})
    others = promoted_asset_name("")
    if names and all(n.startswith(others) and n != promoted_asset_name(model_name)
                     for n in names):
        return names
    return []


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
    if other := other_models_only(context, cfg.model_name):
        raise AirflowSkipException(f"triggered by {', '.join(other)} only: this DAG "
                                   f"re-scores model_name {cfg.model_name}'s champions")
    pinned = promoted_version_uri(context, cfg.model_name)
    if pinned and cfg.model == "champion":
        print(f"model: {pinned}, the champion the triggering promotion names")
        cfg.model = pinned
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
