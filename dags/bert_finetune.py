"""bert_finetune: validate -> data -> tokenize -> [provision] train -> evaluate [release]
-> export -> promote.

Thin wiring only: every step is `tasks.<step>.run(cfg, ctx)`. Steps that read the data or
import TensorFlow (data, tokenize, train, evaluate, export) run as `python -m tasks <step>`
worker processes started and watched by a controller task; the Airflow task process never
imports TensorFlow nor holds the data, and this file imports nothing heavy at parse time.
Tasks pass run-folder / manifest URIs through XCom.

Schedule: manual by default; set BERTFLOW_SCHEDULE (a cron expression or preset such as
"@weekly") for scheduled retraining and backfills (Airflow backfills only periodic DAGs); runs
get real data intervals. Scheduled and backfill runs are keyed by experiment and logical date,
so `airflow backfill create --dag-id bert_finetune --from-date ... --to-date ...` writes one
run folder per date and re-running a date of an experiment reuses it (and the tokenized-data
cache). Data URIs may name the run's date: `gs://bucket/reviews/{ds}/*.jsonl`.
Promoted models are asset events on the alias "bertflow-promoted-model" (schedule on it to
react to a new champion).
"""
from __future__ import annotations

import os
import re
import sys
from datetime import datetime, timedelta
from pathlib import Path

# The pipeline package lives next to dags/; images put it on PYTHONPATH, a checkout may not.
_PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)
if _PROJECT_ROOT not in sys.path:
    sys.path.insert(0, _PROJECT_ROOT)

from airflow.sdk import (Asset, AssetAlias, BaseOperator, BaseOperatorLink,  # noqa: E402
                         Param, dag, task)

from tasks.config import param_schemas  # noqa: E402  (pydantic only; no TensorFlow)

DAG_ID = "bert_finetune"
PROMOTED = AssetAlias("bertflow-promoted-model")


def _load(run_uri: str):
    """Config and context of a run folder (imported lazily: parse time stays light)."""
    from tasks.runlayout import load_run

    return load_run(run_uri)


# .../runs/{dag_id}/{run_key}, optionally followed by /{step}/manifest.json
_RUN_FOLDER = re.compile(r"/runs/([A-Za-z0-9_][A-Za-z0-9._-]*)/([A-Za-z0-9_][A-Za-z0-9._-]*)"
                         r"(?:/[A-Za-z_]+/manifest\.json)?/?$")


def run_page_path(uri: str) -> str:
    """`bertflow/runs/{dag_id}/{run_key}` (the run page under the api-server's base URL) for a
    run folder or step manifest URI; "" if the URI is not under a `runs/{dag_id}/{run_key}`."""
    match = _RUN_FOLDER.search(uri or "")
    return f"bertflow/runs/{match[1]}/{match[2]}" if match else ""


class RunPageLink(BaseOperatorLink):
    """"bertflow run": the task's run page in the bertflow plugin. Airflow 3 calls get_link in
    the worker when the task ends and keeps the result as an XCom, which the UI reads. The run
    folder comes from the task's return value (its step manifest URI) or, for a task that
    failed before returning one, from its rendered `run_uri`."""

    name = "bertflow run"

    def get_link(self, operator, *, ti_key) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        path = run_page_path(str(XCom.get_value(ti_key=ti_key, key="return_value") or ""))
        if not path and isinstance(getattr(operator, "run_uri", None), str):
            path = run_page_path(operator.run_uri)
        if not path:
            return ""
        try:
            from airflow.configuration import conf

            base = conf.get("api", "base_url", fallback="/") or "/"
        except ImportError:  # a worker with the task SDK only
            base = "/"
        return base.rstrip("/") + "/" + path


class WorkerStepOperator(BaseOperator):
    """Controller for a step that runs in worker processes.

    Starts the workers for `step` (the provisioned cluster spec for train/evaluate, one
    process otherwise) on the configured backend (local processes, Kubernetes, Vertex AI, a
    TPU VM), streams their output into this task's log, fails with the worker's error text,
    and stops them when Airflow kills the task. Returns the step's manifest URI.
    """

    template_fields = ("run_uri",)
    ui_color = "#fde9c9"
    operator_extra_links = (RunPageLink(),)

    def __init__(self, *, step: str, run_uri: str, distributed: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.step = step
        self.run_uri = run_uri
        self.distributed = distributed
        self._controller = None

    def execute(self, context) -> str:
        from dataclasses import replace

        from tasks import credentials, provision, storage
        from tasks.errors import WorkerError

        cfg, ctx = _load(self.run_uri)
        if self.distributed:
            manifest = storage.read_json(ctx.manifest_uri("provision"))
            spec = provision.WorkerSpec.from_dict(manifest["workers"][self.step])
        else:
            spec = provision.single_process_spec(self.step, self.run_uri)
        spec = replace(spec, step=self.step)
        self.log.info("%s: %d process(es) on %s, strategy %s, cluster %s", self.step,
                      len(spec.roles), cfg.provisioner, spec.strategy or "-",
                      spec.cluster or "single")
        # Workers cannot reach Airflow's connections; the backend hands them over without
        # writing them into any spec, object or log.
        self._controller = provision.backend_for(cfg).controller(
            cfg, ctx, spec, log=self.log.info, secrets=credentials.worker_env(cfg))
        self._controller.run()
        manifest_uri = ctx.manifest_uri(self.step)
        if not storage.exists(manifest_uri):
            raise WorkerError(f"{self.step} workers finished but wrote no {manifest_uri}")
        return manifest_uri

    def on_kill(self) -> None:
        if self._controller is not None:
            self._controller.stop()


def _schedule():
    """BERTFLOW_SCHEDULE (a cron expression or preset such as @weekly), the one place the
    schedule is set, as a data-interval timetable: each scheduled or backfill run covers
    [previous tick, this tick), which date placeholders such as {data_interval_start:%Y-%m-%d}
    resolve from. Unset: manual only. catchup stays off; backfills fill history."""
    from airflow.sdk.definitions.timetables.interval import CronDataIntervalTimetable

    expression = os.environ.get("BERTFLOW_SCHEDULE")
    return CronDataIntervalTimetable(expression, timezone="UTC") if expression else None


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
        from tasks import data, storage, uri_templates
        from tasks.provision import backend_for
        from tasks.config import parse_config
        from tasks.runlayout import RunContext, init_run, run_key_for

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
        backend = backend_for(cfg)
        run_type = getattr(dag_run.run_type, "value", dag_run.run_type)
        iso = logical.isoformat() if logical else None
        ctx = RunContext(artifact_root=cfg.artifact_root, dag_id=dag_run.dag_id,
                         run_key=run_key_for(run_type, iso, dag_run.run_id, cfg.experiment),
                         run_id=dag_run.run_id, experiment=cfg.experiment,
                         logical_date=iso or "")
        backend.check(cfg, ctx)  # e.g. remote workers need a gs:// or s3:// run folder
        return init_run(cfg, ctx)

    @task
    def provision(run_uri: str) -> str:
        from tasks import provision as provision_step

        return provision_step.run(*_load(run_uri))

    @task
    def release(run_uri: str) -> str:
        from tasks.provision import release as release_step

        return release_step.run(*_load(run_uri))

    # One promote at a time across runs (a backfill finishes several together): the first
    # event for a new model name makes Airflow create its asset, and two such creations at
    # once break the unique (name, uri) index and fail a task that had succeeded (seen on
    # Postgres, Airflow 3.3). The gate itself is safe either way (CHAMPION.json is written
    # conditionally); serial promotes also record a clean champion history.
    @task(outlets=[PROMOTED], max_active_tis_per_dag=1)
    def promote(run_uri: str, export_manifest_uri: str, **context) -> dict:
        """Quality gate; a promoted model becomes an asset event consumers can schedule on."""
        from tasks import promote as promote_step, storage
        from tasks.config import join_uri

        cfg, ctx = _load(run_uri)
        result = storage.read_json(promote_step.run(cfg, ctx))
        if result["promoted"]:
            exported = storage.read_json(export_manifest_uri)
            location = join_uri(cfg.resolved_export_uri(), cfg.model_name)
            uri = location if "://" in location else "file://" + location
            context["outlet_events"][PROMOTED].add(
                Asset(name=f"bertflow-model-{cfg.model_name}", uri=uri),
                extra={"version_uri": exported["version_uri"], "version": exported["version"]})
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
    promote(run_uri, exported.output)


bert_finetune()
