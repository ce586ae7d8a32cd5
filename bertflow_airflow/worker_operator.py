"""WorkerStepOperator: the Airflow task that controls a step's worker processes, and its
"bertflow run" extra link. Imported by the DAG files at parse time, so it imports nothing
heavy at module level (no TensorFlow; the tasks package only inside methods)."""
from __future__ import annotations

import re

from airflow.sdk import BaseOperator, BaseOperatorLink


def load_run(run_uri: str):
    """Config and context of a run folder (imported lazily: parse time stays light)."""
    from tasks.runs.runlayout import load_run as _load_run

    return _load_run(run_uri)


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


LABEL_TEMPLATE = "{{ task.map_label }}"


class WorkerStepOperator(BaseOperator):
    """Controller for a step that runs in worker processes.

    Starts the workers for `step` (the provisioned cluster spec for train/evaluate, one
    process otherwise; none for evaluate when the train step already evaluated) on the
    configured backend (local processes, Kubernetes, Vertex AI, a TPU VM), streams their
    output into this task's log, fails with the worker's error text, and stops them when
    Airflow kills the task. Returns the step's manifest URI. `map_label`
    names a mapped instance in the UI (a sweep's trial values) with
    `map_index_template=LABEL_TEMPLATE`.
    """

    template_fields = ("run_uri", "map_label")
    ui_color = "#fde9c9"
    operator_extra_links = (RunPageLink(),)

    def __init__(self, *, step: str, run_uri: str, distributed: bool = False,
                 map_label: str = "", **kwargs):
        super().__init__(**kwargs)
        self.step = step
        self.run_uri = run_uri
        self.map_label = map_label
        self.distributed = distributed
        self._controller = None

    def execute(self, context) -> str:
        from dataclasses import replace

        from tasks.io import credentials, storage
        from tasks.provision.backends import backend_for
        from tasks.errors import WorkerError
        from tasks.provision import attempts

        cfg, ctx = load_run(self.run_uri)
        if self.step == "evaluate":
            from tasks.steps import evaluation_publish

            published = evaluation_publish.from_train(cfg, ctx)
            if published is not None:
                self.log.info("evaluate: the train step evaluated its model in memory "
                              "(evaluate_in_train); published its metrics, no workers started")
                return published
        spec = replace(self.worker_spec(cfg, ctx), step=self.step)
        self.log.info("%s: %d process(es) on %s, strategy %s, cluster %s", self.step,
                      len(spec.roles), cfg.provisioner, spec.strategy or "-",
                      spec.cluster or "single")
        # Workers cannot reach Airflow's connections; the backend hands them over without
        # writing them into any spec, object or log.
        # Preempted or lost workers are provisioned again inside this try, up to
        # max_preemptions (tasks/provision/attempts.py): Airflow's retries stay for failures.
        self._controller = attempts.run_step(
            backend_for(cfg), cfg, ctx, spec, log=self.log.info,
            secrets=credentials.worker_env(cfg))
        self._controller.run()
        manifest_uri = ctx.manifest_uri(self.step)
        if not storage.exists(manifest_uri):
            raise WorkerError(f"{self.step} workers finished but wrote no {manifest_uri}")
        if self.step == "train":
            pruned = (storage.read_json(manifest_uri).get("validation") or {}).get("pruned")
            if pruned:
                # A sweep's trial stopped by its pruning rule ends as a success whose name in
                # the grid says so: Airflow has no "pruned" state, and a skipped trial would
                # skip pick_best (all_done_min_one_success counts a skip as not done).
                self.map_label = f"{self.map_label} (pruned)".strip()
                self.log.info("trial %s; its model is kept, never chosen", pruned)
        return manifest_uri

    def worker_spec(self, cfg, ctx):
        """The step's WorkerSpec: the provisioned cluster's for a distributed step, else one
        process."""
        from tasks.io import storage
        from tasks.provision.spec import WorkerSpec, single_process_spec

        if self.distributed:
            manifest = storage.read_json(ctx.manifest_uri("provision"))
            return WorkerSpec.from_dict(manifest["workers"][self.step])
        return single_process_spec(self.step, self.run_uri)

    def on_kill(self) -> None:
        if self._controller is not None:
            self._controller.stop()
