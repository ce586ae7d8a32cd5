"""The bertflow Airflow plugin: loads through Airflow's plugin manager and lists artifacts."""
from __future__ import annotations

from airflow import plugins_manager
from fastapi.testclient import TestClient

from tasks import storage


def bertflow_app():
    apps, _ = plugins_manager.get_fastapi_plugins()
    return next(a["app"] for a in apps if a["url_prefix"] == "/bertflow")


def test_plugin_registers_its_app_and_nav_view():
    assert bertflow_app() is not None
    views, _ = plugins_manager._get_ui_plugins()
    assert any(v["href"] == "/bertflow/" for v in views)


def test_pages_list_runs_and_models_from_the_artifact_store(artifact_root):
    storage.write_json(f"{artifact_root}/runs/bert_finetune/2024-01-01/context.json", {})
    version = f"{artifact_root}/models/bert-classifier/v1"
    storage.write_text(f"{version}/model_card.md", "# bert-classifier v1\n")
    storage.write_json(f"{version}/_COMPLETE.json", {})
    storage.write_text(f"{artifact_root}/models/bert-classifier/v2/model_card.md", "partial")

    client = TestClient(bertflow_app())
    page = client.get("/").text
    assert "bert_finetune / 2024-01-01" in page
    assert "bert-classifier / v1" in page and "v2" not in page  # incomplete versions hidden
    assert client.get("/models/bert-classifier/v1/card").text == "# bert-classifier v1\n"
    assert client.get("/models/bert-classifier/v9/card").status_code == 404
