"""The bertflow page's markup lives in autoescaped Jinja2 templates (plugins/bertflow_ui/
templates/), never in Python strings, so stored text (run ids, experiment names, trial values,
versions) is always printed as text: checked on the templates' environment, on the plugin's
Python source, and through Airflow's real api-server app with hostile values in the files."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import airflow  # noqa: F401  (puts the plugins folder on sys.path, as in every Airflow process)
from plugin_helpers import (DAG_ID, MODEL, SWEEP_DAG, SWEEP_KEY, api_server,  # noqa: F401
                            build_artifacts, build_sweep, logged_in)
from tasks.io.uris import join_uri
from tasks.io import storage

PLUGINS = Path(__file__).resolve().parent.parent / "plugins"
SCRIPT = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
QUOTE_BREAK = "x' onmouseover='alert(2)"  # would end a single-quoted attribute if printed raw
TAG = re.compile(r"<\s*/?\s*[A-Za-z][A-Za-z0-9]*(\s|/?>)")


def test_every_template_is_autoescaped():
    from bertflow_ui import templating

    names = sorted(p.name for p in templating.TEMPLATES.glob("*.html"))
    assert {"base.html", "index.html", "run.html", "compare.html", "charts.html"} <= set(names)
    for name in names:
        assert templating.env.autoescape(name) is True, name
        assert templating.env.get_template(name).render is not None
    assert templating.env.from_string("{{ x }}").render(x=SCRIPT) == ESCAPED


def _string_literals(tree: ast.AST) -> list[str]:
    """Every str constant of a module but its docstrings."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings]


def test_no_plugin_module_holds_markup_in_a_string():
    modules = sorted(PLUGINS.rglob("*.py"))
    assert PLUGINS / "bertflow_ui" / "routes.py" in modules
    for path in modules:
        found = [s for s in _string_literals(ast.parse(path.read_text())) if TAG.search(s)]
        assert not found, (path, found)
    # The entry file Airflow loads stays small: registration only.
    assert len((PLUGINS / "bertflow_plugin.py").read_text().splitlines()) < 80


@pytest.fixture
def hostile(artifact_root, tmp_path):
    """The synthetic tree plus files holding markup where names and labels go."""
    build_artifacts(artifact_root)
    built = build_sweep(artifact_root, tmp_path / "scratch")
    run = join_uri(artifact_root, "runs", DAG_ID, "manual__hostile")
    storage.write_json(join_uri(run, "context.json"), {
        "dag_id": DAG_ID, "run_key": "manual__hostile", "run_id": SCRIPT,
        "experiment": QUOTE_BREAK})
    storage.write_json(join_uri(run, "config.json"), {"strategy": SCRIPT,
                                                       "learning_rate": SCRIPT})
    storage.write_json(join_uri(run, "export", "manifest.json"),
                       {"model_name": MODEL, "version": "<img src=x onerror=alert(3)>"})
    sweep_uri = built["sweep"].run_uri
    record = storage.read_json(join_uri(sweep_uri, "sweep.json"))
    record["trials"][0]["values"] = {"learning_rate": SCRIPT}
    record["trials"][1]["values"] = {}
    record["trials"][1]["label"] = SCRIPT  # an older sweep.json: its stored label
    storage.write_json(join_uri(sweep_uri, "sweep.json"), record)
    return built


def _clean(text: str) -> None:
    assert "<script" not in text.lower() and "<img" not in text.lower()
    assert "onmouseover='" not in text


def test_run_ids_labels_and_names_are_printed_as_text(logged_in, hostile):
    index = logged_in.get("/bertflow/")
    assert index.status_code == 200, index.text
    _clean(index.text)
    assert index.text.count(ESCAPED) >= 4  # run id, strategy, learning rate, 2 trial labels
    assert f">learning_rate={ESCAPED}</a>" in index.text  # a trial labelled by its values
    assert "&lt;img src=x onerror=alert(3)&gt;" in index.text
    assert "data-experiment='x&#39; onmouseover=&#39;alert(2)'" in index.text
    for path in (f"/bertflow/runs/{DAG_ID}/manual__hostile",
                 f"/bertflow/runs/{SWEEP_DAG}/{SWEEP_KEY}",
                 f"/bertflow/runs/{SWEEP_DAG}/{SWEEP_KEY}__trial-01",
                 f"/bertflow/runs/{SWEEP_DAG}/{SWEEP_KEY}__trial-02",
                 f"/bertflow/compare?run={SWEEP_DAG}/{SWEEP_KEY}__trial-01"
                 f"&run={DAG_ID}/manual__hostile"):
        page = logged_in.get(path)
        assert page.status_code == 200, (path, page.text[:300])
        _clean(page.text)
        assert ESCAPED in page.text, path


def test_airflow_imports_the_entry_file_only():
    """Airflow's plugin loader imports every .py file under the plugins folder as a top-level
    module named after the file; plugins/.airflowignore keeps it out of the page's package,
    which the entry file imports as `bertflow_ui`."""
    import sys

    from airflow import plugins_manager

    plugins, errors = plugins_manager._get_plugins()
    assert not errors, errors
    [page] = [p for p in plugins if p.name == "bertflow"]
    assert str(page.source).endswith("bertflow_plugin.py")
    for stem in ("routes", "charts", "templating", "formatting", "__init__"):
        module = sys.modules.get(stem)
        assert module is None or "bertflow_ui" not in str(getattr(module, "__file__", "")), stem
    assert sys.modules["bertflow_ui.routes"].app is page.fastapi_apps[0]["app"]
