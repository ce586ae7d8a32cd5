"""Airflow plugin: the "bertflow" page, mounted by the api-server at /bertflow/ and linked from
the UI's navigation bar.

- `/bertflow/`: models (complete versions per model name, the champion marked, metrics, model
  cards) and the experiments table (one row per run folder, grouped by experiment; a sweep's
  row shows its best trial's figures, its trials follow it, labelled by their searched
  values; `?sort=` a column, `&order=asc|desc`).
- `/bertflow/runs/{dag_id}/{run_key}`: one run: key config, training curves (loss, accuracy,
  learning rate against step, from train/history.json) and the confusion matrix as inline SVG,
  per-class metrics, the exported version with the gate's decision, and the command that opens
  the run's TensorBoard logs. A sweep's page tables its trials and shows its best trial's
  training, evaluation, exported version and gate.
- `/bertflow/runs/{dag_id}/{run_key}/logs/{step}/{role}-{index}.log`: a worker's log, as kept
  in the run folder (tasks/provision/worker_logs.py); the run page links every one.
- `/bertflow/models/{model}/{version}/card[?location={location_id}]`: a version's model card,
  from `{artifact_root}/models` or, with `location`, from another export location.
- `/bertflow/models/{model}/{version}[?location=...]`: a version's lineage (lineage.json: data
  URIs and hashes, token cache key, base checkpoint, code version, DAG run, metrics, config).
- `/bertflow/data?q=...`: the versions whose data has that sha256, URI (or URI part) or token
  cache key: "which versions came from this data".
- `/bertflow/compare?run={dag_id}/{run_key}&run=...`: two or more runs side by side (the
  config fields and metrics that differ, overlaid curves, each confusion matrix;
  tasks.runs.compare), from the index's checkboxes or a run page's "compare with…".

Models are listed from every export location: `{artifact_root}/models` and each distinct
resolved `export_uri` the runs recorded in their config.json (tasks.runs.run_summary). A link
names a location only by its `location_id` (a hash the server computes), which the card route
looks up in that server-side set; a location path never comes from the request.

Server-rendered HTML, no JavaScript (the index's Compare button is a plain GET form), in
Airflow's fonts and colours, light and dark. It reads the artifact store through
`tasks.io.storage` (`tasks.runs.run_summary`), so local, gs:// and s3:// roots work, and never
talks to training processes.

This file only registers the page; the page itself is the package next to it
(plugins/bertflow_ui/): `routes` (the FastAPI app with its auth dependencies and handlers),
`templates/` (Jinja2, autoescaped), `charts` (the SVG charts' geometry).
"""
from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from bertflow_airflow.timetables import BackfillOnlyTimetable
# Airflow puts the plugins folder on the import path; plugins/.airflowignore keeps its loader, which
# imports every .py file there as a top-level module, out of the package.
from bertflow_ui.routes import app


class BertflowPlugin(AirflowPlugin):
    name = "bertflow"
    fastapi_apps = [{"app": app, "url_prefix": "/bertflow", "name": "bertflow artifacts"}]
    # bert_finetune's default schedule: the scheduler and api-server deserialize it by name.
    timetables = [BackfillOnlyTimetable]
    external_views = [{"name": "bertflow models", "href": "/bertflow/", "destination": "nav",
                       "url_route": "bertflow"}]
