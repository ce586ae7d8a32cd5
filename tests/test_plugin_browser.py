"""The run page in a real browser: Airflow's api-server app served by uvicorn on a loopback
port (in a thread of the test process, faster than `airflow api-server`), headless Chromium
logged in with the UI's `_token` cookie. Saves screenshots under the test's tmp path. Like
tests/test_airflow_standalone.py it fails, not skips, without /usr/bin/chromium
(`make test-deps`)."""
from __future__ import annotations

import threading
import time

import pytest

from plugin_helpers import DAG_ID, LABELS, build_artifacts
from ui_helpers import Browser, free_port

RUN_KEY = "baseline__2024-01-01T00_00_00_00_00"


@pytest.fixture(scope="module")
def served(airflow_db):
    """(base URL, JWT) of the api-server app on 127.0.0.1."""
    import uvicorn
    from airflow.api_fastapi.app import create_app, get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    app = create_app(apps="core")
    token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin",
                                                                  role="admin"))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}", token
    server.should_exit = True
    thread.join(timeout=30)


@pytest.fixture
def browser():
    b = Browser()
    yield b
    b.close()


def test_run_page_renders_svg_charts_and_matrix(served, browser, artifact_root, tmp_path):
    base, token = served
    build_artifacts(artifact_root)

    # Without the login cookie the page is refused.
    browser.navigate(f"{base}/bertflow/runs/{DAG_ID}/{RUN_KEY}")
    browser.wait_js("document.readyState === 'complete' && document.body !== null")
    assert "Not authenticated" in browser.evaluate("document.body.innerText")

    browser.set_cookie("_token", token, base)
    browser.navigate(f"{base}/bertflow/runs/{DAG_ID}/{RUN_KEY}")
    browser.wait_js("document.querySelectorAll('svg polyline').length === 3")
    boxes = browser.evaluate("""[...document.querySelectorAll('svg.chart polyline')].map(p => {
        const b = p.getBBox(); return [p.getAttribute('class'), b.width, b.height]; })""")
    assert [b[0] for b in boxes] == ["loss", "accuracy", "learning_rate"]
    assert all(w > 250 and h > 50 for _, w, h in boxes), boxes  # drawn across the plot
    matrix = browser.evaluate("""(() => { const s = document.querySelector('svg.confusion');
        const b = s.getBBox();
        return {width: b.width, height: b.height,
                cells: s.querySelectorAll('rect.cell').length,
                rows: [...s.querySelectorAll('text.row-label')].map(t => t.textContent),
                fills: [...s.querySelectorAll('rect.cell')].map(r =>
                    getComputedStyle(r).fill)}; })()""")
    assert matrix["width"] > 100 and matrix["height"] > 100 and matrix["cells"] == 9
    assert matrix["rows"] == [f"{lb}{lb}" for lb in LABELS]  # <title> text + shown text
    assert len(set(matrix["fills"])) > 3  # shaded by value, not one flat colour
    shot = browser.screenshot(tmp_path / "run_page.png")
    assert shot.stat().st_size > 10_000

    browser.navigate(f"{base}/bertflow/")
    browser.wait_js("document.querySelectorAll('table.experiments tr.run').length === 3")
    browser.screenshot(tmp_path / "index_page.png")


def test_compare_two_runs_ticked_on_the_index(served, browser, artifact_root, tmp_path):
    """Tick two runs' checkboxes, press Compare: the differing fields, one curve per run and a
    confusion matrix per run."""
    base, token = served
    build_artifacts(artifact_root)
    browser.set_cookie("_token", token, base)
    browser.navigate(f"{base}/bertflow/")
    browser.wait_js("document.querySelectorAll(\"input[name='run']\").length === 3")
    for key in ("baseline__2024-01-01T00_00_00_00_00", "baseline__2024-01-02T00_00_00_00_00"):
        browser.click(f"document.querySelector(\"input[value='{DAG_ID}/{key}']\")")
    browser.click("document.querySelector(\"#compare button\")")
    browser.wait_js("document.querySelector('table.differs') !== null")
    assert "/bertflow/compare?run=" in browser.evaluate("location.href")
    page = browser.evaluate("""(() => ({
        fields: [...document.querySelectorAll('table.differs.config tr.differs')]
            .map(r => r.dataset.field),
        lines: [...document.querySelectorAll("svg.chart[data-series='loss'] polyline")]
            .map(p => p.getBBox().width),
        matrices: document.querySelectorAll('table.confusion-table').length,
        folded: document.querySelector('details.equal.config').open}))()""")
    assert page["fields"] == ["epochs", "learning_rate"]
    assert len(page["lines"]) == 2 and all(w > 200 for w in page["lines"]), page
    assert page["matrices"] == 2 and page["folded"] is False
    browser.click("document.querySelector('details.equal.config summary')")  # the toggle
    browser.wait_js("document.querySelector('details.equal.config').open")
    browser.screenshot(tmp_path / "compare_page.png")
