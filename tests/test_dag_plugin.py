"""The bertflow Airflow plugin, mounted by Airflow's own api-server app (in process, on the
test's SQLite metadata DB): it answers only logged-in users, and lists artifacts."""
from __future__ import annotations

from airflow import plugins_manager

from plugin_helpers import api_server  # noqa: F401  (fixture)
from tasks.io import storage


def test_plugin_registers_its_app_and_nav_view():
    apps, _ = plugins_manager.get_fastapi_plugins()
    assert any(a["url_prefix"] == "/bertflow" for a in apps)
    views, _ = plugins_manager._get_ui_plugins()
    assert any(v["href"] == "/bertflow/" for v in views)


def test_anonymous_and_forged_requests_are_refused(api_server):
    client, _ = api_server
    assert client.get("/bertflow/").status_code == 401
    assert client.get("/bertflow/models/m/v1/card").status_code == 401
    forged = {"Authorization": "Bearer not-a-jwt"}
    assert client.get("/bertflow/", headers=forged).status_code == 403


def test_logged_in_user_sees_runs_and_models(api_server, artifact_root):
    client, token = api_server
    storage.write_json(f"{artifact_root}/runs/bert_finetune/2024-01-01/context.json", {})
    version = f"{artifact_root}/models/bert-classifier/v1"
    storage.write_text(f"{version}/model_card.md", "# bert-classifier v1\n")
    storage.write_json(f"{version}/_COMPLETE.json", {})
    storage.write_text(f"{artifact_root}/models/bert-classifier/v2/model_card.md", "partial")

    client.cookies.set("_token", token)  # what the UI holds after login
    try:
        page = client.get("/bertflow/")
        assert page.status_code == 200, page.text
        assert "href='runs/bert_finetune/2024-01-01'" in page.text
        assert "href='models/bert-classifier/v1/card'" in page.text
        assert "v2" not in page.text  # incomplete
        card = client.get("/bertflow/models/bert-classifier/v1/card")
        assert card.text == "# bert-classifier v1\n"
        assert client.get("/bertflow/models/bert-classifier/v9/card").status_code == 404
        # No request path reaches the store unchecked.
        for bad in ("..", "%2e%2e", "..%2F..%2Fruns"):
            resp = client.get(f"/bertflow/models/{bad}/v1/card")
            assert resp.status_code in (400, 404), (bad, resp.status_code)
    finally:
        client.cookies.clear()
