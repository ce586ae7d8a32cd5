"""Airflow plugin: a "bertflow" page listing run folders and exported models.

It reads the artifact store (through `tasks.storage`, so local, gs:// and s3:// roots work)
and never talks to training processes. Mounted by the api-server at /bertflow/ and linked from
the UI's navigation bar.
"""
from __future__ import annotations

import html
import sys
from pathlib import Path

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import requires_access_dag
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import HTMLResponse, PlainTextResponse

_PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)
if _PROJECT_ROOT not in sys.path:  # the pipeline package lives next to plugins/
    sys.path.insert(0, _PROJECT_ROOT)

from tasks import storage  # noqa: E402
from tasks.config import default_artifact_root, join_uri  # noqa: E402
from tasks.errors import StorageError  # noqa: E402

# The api-server mounts plugin apps without the core API's auth dependencies, so the page
# declares them itself: a logged-in user (the JWT the UI holds as a cookie, or a bearer token)
# allowed to read bert_finetune's runs. Anonymous requests get 401, others without that
# permission 403.
app = FastAPI(title="bertflow artifacts", dependencies=[
    Depends(requires_access_dag("GET", DagAccessEntity.RUN, param_dag_id="bert_finetune"))])


def _relative(root: str, uris: list[str], name: str) -> list[list[str]]:
    """Path parts under `root` of every file called `name` (e.g. the run manifests)."""
    prefix = root.rstrip("/") + "/"
    return sorted((u[len(prefix):].split("/")[:-1] for u in uris if u.endswith("/" + name)),
                  reverse=True)


def artifact_index(root: str) -> dict[str, list[dict]]:
    """Runs (folders with a context.json) and complete model versions under `root`."""
    runs = [{"dag_id": p[0], "run_key": p[1], "uri": join_uri(root, "runs", *p)}
            for p in _relative(join_uri(root, "runs"),
                               storage.list_uris(join_uri(root, "runs")), "context.json")
            if len(p) == 2]
    models_root = join_uri(root, "models")
    models = [{"model": p[0], "version": p[1], "uri": join_uri(models_root, *p)}
              for p in _relative(models_root, storage.list_uris(models_root), "_COMPLETE.json")
              if len(p) == 2]
    return {"runs": runs, "models": models}


@app.get("/", response_class=HTMLResponse)
def index() -> str:
    root = default_artifact_root()
    found = artifact_index(root)
    rows = "".join(
        f"<li>{html.escape(m['model'])} / {html.escape(m['version'])} "
        f"<a href='models/{html.escape(m['model'])}/{html.escape(m['version'])}/card'>"
        f"model card</a> "
        f"<code>{html.escape(m['uri'])}</code></li>" for m in found["models"])
    runs = "".join(f"<li>{html.escape(r['dag_id'])} / {html.escape(r['run_key'])} "
                   f"<code>{html.escape(r['uri'])}</code></li>" for r in found["runs"])
    return (f"<h2>bertflow artifacts in <code>{html.escape(root)}</code></h2>"
            f"<h3>Models</h3><ul>{rows or '<li>none yet</li>'}</ul>"
            f"<h3>Runs</h3><ul>{runs or '<li>none yet</li>'}</ul>")


@app.get("/models/{model}/{version}/card", response_class=PlainTextResponse)
def model_card(model: str, version: str) -> str:
    if "/" in model + version or ".." in model + version:
        raise HTTPException(400, "bad model or version name")
    uri = join_uri(default_artifact_root(), "models", model, version, "model_card.md")
    try:
        return storage.read_text(uri)
    except StorageError as err:
        raise HTTPException(404, str(err)) from None


class BertflowPlugin(AirflowPlugin):
    name = "bertflow"
    fastapi_apps = [{"app": app, "url_prefix": "/bertflow", "name": "bertflow artifacts"}]
    external_views = [{"name": "bertflow models", "href": "/bertflow/", "destination": "nav",
                       "url_route": "bertflow"}]
