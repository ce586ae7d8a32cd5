"""Runs and versions in a REAL MLflow tracking server (tests/mlflow_server.py: `mlflow server`
from PyPI on loopback, SQLite backend, basic auth), read back through its REST API.

One dag.test() with a tiny config logs through an Airflow connection's credentials; the
failure paths call the step functions on a copy of that run folder: a server that is down
and one that refuses the credentials leave a warning, a flag on the run page and a run that
goes on."""
from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import subprocess
import sys

import pytest

import mlflow_server
from plugin_helpers import api_server, logged_in  # noqa: F401  (fixtures)
from storage_servers import free_port
from train_helpers import tiny_model_dir  # noqa: F401  (fixture)
from bertflow_airflow.demo import run_dag, run_folder
from tasks.config import parse_config
from tasks.errors import ConfigError
from tasks.io import storage
from tasks.io.uris import join_uri
from tasks.runs import run_summary, runlayout
from tasks.steps import promote
from tasks.tracking import mlflow_log

TINY = {"max_seq_length": 32, "epochs": 1, "max_steps": 4, "per_replica_batch_size": 8,
        "num_shards": 1, "num_workers": 1, "eval_batch_size": 32, "experiment": "mlflow-e2e",
        "model_name": "mlflow-model", "eval_every_steps": 2}
CONN_ID = "bertflow_mlflow"
# The admin's credentials as the Airflow connection mlflow_conn_id names, from the environment.
CONN_ENV = {f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps(
    {"conn_type": "http", "login": mlflow_server.ADMIN, "password": mlflow_server.PASSWORD})}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with mlflow_server.serving(tmp_path_factory.mktemp("mlflow")) as running:
        yield running


@pytest.fixture(scope="module")
def logged(server, airflow_db, tmp_path_factory, tiny_model_dir):  # noqa: F811
    """One bert_finetune run through dag.test() logging to the server with the connection's
    credentials (the admin's, as an Airflow connection in the environment). The tiny random
    model: the logging is under test here, not the checkpoint."""
    root = str(tmp_path_factory.mktemp("artifacts"))
    os.environ.update(CONN_ENV)
    try:
        dag_run = run_dag({**TINY, "artifact_root": root, "base_model": str(tiny_model_dir),
                           "mlflow_tracking_uri": server.url, "mlflow_conn_id": CONN_ID})
    finally:
        for key in CONN_ENV:
            os.environ.pop(key, None)
    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    assert dag_run.state == "success", states
    run_uri = run_folder(dag_run, root)
    return root, run_uri, storage.read_json(join_uri(run_uri, "mlflow", "manifest.json"))


def test_the_run_is_logged_with_params_metrics_artifacts_and_lineage(server, logged):
    root, run_uri, record = logged
    assert record["status"] == "logged", record
    run = server.api("runs/get", run_id=record["run_id"])["run"]
    experiment = server.api("experiments/get", experiment_id=run["info"]["experiment_id"])
    assert experiment["experiment"]["name"] == "mlflow-e2e"
    assert run["info"]["status"] == "FINISHED"

    config = storage.read_json(join_uri(run_uri, "config.json"))
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    assert set(params) == set(config)
    assert params["learning_rate"] == json.dumps(config["learning_rate"])
    assert params["mlflow_tracking_uri"] == server.url

    history = storage.read_json(join_uri(run_uri, "train", "history.json"))

    def logged_history(key):
        found = server.api("metrics/get-history", run_id=record["run_id"],
                           metric_key=key).get("metrics", [])
        return sorted((m["step"], m["value"]) for m in found)

    assert logged_history("train/loss") == [
        (r["step"], pytest.approx(r["loss"])) for r in history["records"]]
    assert len(history["records"]) == TINY["max_steps"]
    validation = history["validation"]
    assert len(validation) == 2  # eval_every_steps 2 of 4 steps
    assert logged_history("validation/accuracy") == [
        (r["step"], pytest.approx(r["accuracy"])) for r in validation]
    test_metrics = storage.read_json(join_uri(run_uri, "evaluate", "metrics.json"))
    latest = {m["key"]: m["value"] for m in run["data"]["metrics"]}
    assert latest["test/accuracy"] == pytest.approx(test_metrics["accuracy"])
    assert latest["test/macro_f1"] == pytest.approx(test_metrics["macro_f1"])

    files = {f["path"] for f in server.api("artifacts/list", run_id=record["run_id"])["files"]}
    assert {"model_card.md", "lineage.json", "metrics.json", "confusion_matrix.json",
            "confusion_matrix.csv"} <= files
    stored = server.folder / "artifacts" / run["info"]["experiment_id"] / record["run_id"]
    matrix = json.loads((stored / "artifacts" / "confusion_matrix.json").read_text())
    assert matrix["matrix"] == test_metrics["confusion_matrix"]
    card = storage.read_text(join_uri(record["version_uri"], "model_card.md"))
    assert (stored / "artifacts" / "model_card.md").read_text() == card

    tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    lineage = storage.read_json(join_uri(record["version_uri"], "lineage.json"))
    assert tags["bertflow.run_uri"] == run_uri
    assert tags["bertflow.version_uri"] == record["version_uri"]
    assert tags["bertflow.tfrecord_cache_key"] == lineage["tfrecord_cache_key"]
    assert tags["bertflow.data.train.sha256"] == lineage["data"]["train"]["sha256"]
    assert tags["mlflow.runName"] == run_uri.rstrip("/").rsplit("/", 1)[1]


def test_the_version_is_registered_and_the_champion_alias_follows_promote(server, logged):
    _, run_uri, record = logged
    versions = server.api("model-versions/search", filter="name='mlflow-model'")
    [version] = versions["model_versions"]
    assert version["version"] == record["model_version"]
    assert version["run_id"] == record["run_id"]
    tags = {t["key"]: t["value"] for t in version["tags"]}
    assert tags["bertflow.version_uri"] == record["version_uri"]
    # A local export: MLflow refuses local sources outside the run's artifacts.
    assert version["source"] == f"runs:/{record['run_id']}"
    promoted = storage.read_json(join_uri(run_uri, "promote", "manifest.json"))
    assert promoted["promoted"] and promoted["mlflow"]["status"] == "moved"
    alias = server.api("registered-models/alias", name="mlflow-model", alias="champion")
    assert alias["model_version"]["version"] == record["model_version"]


def test_a_retry_reuses_the_run_and_the_version(server, logged, monkeypatch):
    root, run_uri, record = logged
    for key, value in CONN_ENV.items():
        monkeypatch.setenv(key, value)
    cfg, ctx = runlayout.load_run(run_uri)
    again = mlflow_log.log_run(cfg, ctx)
    assert (again["run_id"], again["model_version"]) == (record["run_id"],
                                                         record["model_version"])
    found = _post(server, "runs/search", {"experiment_ids": [again["experiment_id"]]})
    assert [r["info"]["run_id"] for r in found.get("runs", [])] == [record["run_id"]]


def _post(server, path, body):
    import requests

    resp = requests.post(f"{server.url}/api/2.0/mlflow/{path}", json=body,
                         auth=(mlflow_server.ADMIN, mlflow_server.PASSWORD), timeout=60)
    resp.raise_for_status()
    return resp.json()


def _copy(root: str, run_uri: str, run_key: str):
    """The finished run folder under another run key (its own mlflow/ and promote/)."""
    target = join_uri(root, "runs", "bert_finetune", run_key)
    shutil.copytree(run_uri, target)
    context = storage.read_json(join_uri(target, "context.json"))
    storage.write_json(join_uri(target, "context.json"), {**context, "run_key": run_key})
    return runlayout.load_run(target)


@pytest.mark.parametrize("case", ["down", "refused"])
def test_a_failing_server_warns_once_and_flags_the_run_page(case, server, logged, caplog,
                                                            monkeypatch, logged_in):
    root, run_uri, _ = logged
    cfg, ctx = _copy(root, run_uri, f"failing-{case}")
    if case == "down":
        cfg = cfg.model_copy(update={"mlflow_tracking_uri": f"http://127.0.0.1:{free_port()}",
                                     "mlflow_conn_id": ""})
    else:  # the environment's credentials, refused by the server
        cfg = cfg.model_copy(update={"mlflow_conn_id": ""})
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", mlflow_server.ADMIN)
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "not-the-password")
    with caplog.at_level(logging.WARNING):
        record = mlflow_log.log_run(cfg, ctx)
        result = storage.read_json(promote.run(cfg, ctx))  # already the champion: re-promoted
    assert record["status"] == "failed"
    assert ("401" in record["error"]) if case == "refused" else record["error"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2, warnings  # one per step: logging, then promote's alias
    assert "not-the-password" not in " ".join(warnings) + json.dumps(record)
    assert result["promoted"] and result["mlflow"]["status"] == "failed"

    detail = run_summary.run_detail(root, ctx.dag_id, ctx.run_key)
    assert detail["mlflow"]["logged"]["status"] == "failed"
    monkeypatch.setenv("BERTFLOW_ARTIFACT_ROOT", root)
    page = logged_in.get(f"/bertflow/runs/{ctx.dag_id}/{ctx.run_key}")
    assert page.status_code == 200, page.text
    assert "logging failed" in page.text and "champion alias not moved" in page.text
    good = logged_in.get(f"/bertflow/runs/{ctx.dag_id}/{run_uri.rstrip('/').rsplit('/', 1)[1]}")
    assert "logged as run" in good.text and "logging failed" not in good.text


def test_mlflows_own_ui_shows_the_run_and_the_champion_version(server, logged, tmp_path):
    """MLflow's web UI in headless Chromium (tests/ui_helpers.py), logged in with basic auth:
    the run with its metrics, and the registered version carrying the champion alias."""
    from ui_helpers import Browser

    _, run_uri, record = logged
    run_key = run_uri.rstrip("/").rsplit("/", 1)[1]
    login = base64.b64encode(f"{mlflow_server.ADMIN}:{mlflow_server.PASSWORD}".encode())
    browser = Browser()
    try:
        browser.send("Network.setExtraHTTPHeaders",
                     headers={"Authorization": f"Basic {login.decode()}"})
        browser.navigate(f"{server.url}/#/experiments/{record['experiment_id']}/runs/"
                         f"{record['run_id']}")
        # Right after a navigation the new document may have no body yet: wait_js fails on a
        # script error, so the text is read only once a body exists.
        text = "(document.body ? document.body.innerText : '')"
        browser.wait_js(f"{text}.includes({json.dumps(run_key)}) && "
                        f"{text}.includes('train/loss') && {text}.includes('test/accuracy')")
        browser.screenshot(tmp_path / "mlflow-run.png")
        browser.navigate(f"{server.url}/#/models/mlflow-model/versions/"
                         f"{record['model_version']}")
        browser.wait_js(f"{text}.includes('champion') && {text}.includes('mlflow-model')")
        browser.screenshot(tmp_path / "mlflow-version.png")
    finally:
        browser.close()


def test_with_mlflow_off_nothing_imports_it(tmp_path):
    script = (
        "import sys\n"
        "from tasks.config import parse_config\n"
        "from tasks.runs.runlayout import RunContext\n"
        "from tasks.steps import promote\n"
        "from tasks.tracking import mlflow_log\n"
        f"ctx = RunContext({str(tmp_path)!r}, 'bert_finetune', 'k', 'k')\n"
        "cfg = parse_config({})\n"
        "assert mlflow_log.log_run(cfg, ctx) is None\n"
        "assert mlflow_log.move_champion(cfg, ctx, 'x') is None\n"
        "assert 'mlflow' not in sys.modules, 'mlflow imported'\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "BERTFLOW_ARTIFACT_ROOT": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]


def test_credentials_come_from_the_connection_and_never_from_the_uri(monkeypatch):
    cfg = parse_config({"mlflow_tracking_uri": "http://127.0.0.1:5000", "mlflow_conn_id": "m"})
    monkeypatch.delenv("AIRFLOW_CONN_M", raising=False)
    with pytest.raises(ConfigError, match="mlflow_conn_id.*'m' is not defined"):
        mlflow_log.credentials(cfg)
    for conn, expected in (
            ({"login": "u", "password": "p"},
             {"MLFLOW_TRACKING_USERNAME": "u", "MLFLOW_TRACKING_PASSWORD": "p"}),
            ({"extra": {"token": "t0k"}}, {"MLFLOW_TRACKING_TOKEN": "t0k"}),
            ({"password": "t0k"}, {"MLFLOW_TRACKING_TOKEN": "t0k"})):
        monkeypatch.setenv("AIRFLOW_CONN_M", json.dumps({"conn_type": "http", **conn}))
        assert mlflow_log.credentials(cfg) == expected
    for uri in ("http://u:s3cr3t@mlflow.example", "https://mlflow.example/?token=s3cr3t",
                "file:///tmp/mlruns"):
        with pytest.raises(ConfigError, match="mlflow_tracking_uri") as err:
            parse_config({"mlflow_tracking_uri": uri})
        assert "s3cr3t" not in str(err.value)
