"""The bertflow page in a real browser: Airflow's api-server app served by uvicorn on a
loopback port (in a thread of the test process, faster than `airflow api-server`), headless
Chromium logged in with the UI's `_token` cookie. Saves screenshots under the test's tmp path
(light and dark for the index and a sweep's page). Like tests/test_airflow_standalone.py it
fails, not skips, without /usr/bin/chromium (`make test-deps`)."""
from __future__ import annotations

import threading
import time

import pytest

from plugin_helpers import (DAG_ID, LABELS, SWEEP_DAG, SWEEP_KEY, SWEEP_METRICS,
                            SWEEP_VERSION, build_artifacts, build_sweep)
from ui_helpers import Browser, free_port

RUN_KEY = "baseline__2024-01-01T00_00_00_00_00"
# Airflow's UI shows a plugin page in an iframe beside its navigation bar (4rem): 1328 px of
# a 1400 px window (measured in Airflow 3.3's `airflow standalone`). Checked at 1312, as if
# the main content's padding (0.75rem each side) applied too.
WINDOW, IN_AIRFLOW = 1400, 1400 - 64 - 2 * 12


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


def test_an_earlier_attempts_worker_log_opens_from_the_run_page(served, browser,
                                                               artifact_root):
    """The run page's Worker logs list each provisioning attempt; clicking an earlier
    attempt's worker opens that attempt's own log, served as text."""
    from tasks.io import storage

    base, token = served
    build_artifacts(artifact_root)
    run = f"{artifact_root}/runs/{DAG_ID}/{RUN_KEY}"
    for n in (1, 2):
        storage.write_text(f"{run}/train/logs/chief-0.attempt-{n}.log", f"attempt {n} log\n")
    storage.write_text(f"{run}/train/logs/chief-0.log", "attempt 2 log\n")
    browser.set_cookie("_token", token, base)
    browser.navigate(f"{base}/bertflow/runs/{DAG_ID}/{RUN_KEY}")
    browser.wait_js("document.querySelectorAll('li.log-attempt').length === 2")
    browser.click("document.querySelector(\"li.log-attempt[data-attempt='1'] a.log\")")
    browser.wait_js("document.body !== null && document.body.innerText.trim() === "
                    "'attempt 1 log'")
    assert browser.evaluate("location.pathname").endswith("/train/chief-0.attempt-1.log")


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


def _fits(browser: Browser) -> dict:
    """Whether the page scrolls sideways: the document's and each table's widths."""
    return browser.evaluate("""(() => { const d = document.documentElement;
        return {scroll: d.scrollWidth, client: d.clientWidth, inner: window.innerWidth,
                tables: [...document.querySelectorAll('table')].map(t =>
                    Math.ceil(t.getBoundingClientRect().right))}; })()""")


def _set_width(browser: Browser, width: int | None) -> None:
    if width is None:
        browser.send("Emulation.clearDeviceMetricsOverride")
    else:
        browser.send("Emulation.setDeviceMetricsOverride", width=width, height=1800,
                     deviceScaleFactor=1, mobile=False)


def _colour_scheme(browser: Browser, scheme: str) -> dict:
    browser.send("Emulation.setEmulatedMedia",
                 features=[{"name": "prefers-color-scheme", "value": scheme}])
    return browser.evaluate("""(() => { const s = getComputedStyle(document.documentElement);
        return {bg: s.backgroundColor, fg: s.color, font: s.fontFamily}; })()""")


def test_index_fits_the_window_in_airflow_s_look(served, browser, artifact_root, tmp_path):
    """The index with plain runs and a 2-trial sweep: no horizontal scroll bar at 1400 px, nor
    at the width Airflow's UI gives the page at 1400 px; Airflow's fonts and colours, light
    and dark."""
    base, token = served
    build_artifacts(artifact_root)
    build_sweep(artifact_root, tmp_path / "scratch")
    browser.set_cookie("_token", token, base)
    browser.navigate(f"{base}/bertflow/")
    browser.wait_js("document.querySelectorAll('table.experiments tr.run').length === 6")
    for width in (None, IN_AIRFLOW):
        _set_width(browser, width)
        fits = _fits(browser)
        assert fits["inner"] == (width or WINDOW), fits
        assert fits["scroll"] <= fits["client"], fits
        assert max(fits["tables"]) <= fits["client"], fits
    _set_width(browser, None)
    light = _colour_scheme(browser, "light")
    browser.screenshot(tmp_path / "index_light.png")
    dark = _colour_scheme(browser, "dark")
    browser.screenshot(tmp_path / "index_dark.png")
    # Airflow's bg and fg tokens: white on its "black" (oklch(0.23185 0.0323 266.44)) in
    # light mode, the other way round (fg gray.50) in dark mode.
    assert light["bg"] == "rgb(255, 255, 255)" and "oklch(0.23185" in light["fg"], light
    assert "oklch(0.23185" in dark["bg"] and "oklch(0.985" in dark["fg"], dark
    assert light["font"].startswith("Inter, -apple-system"), light
    rows = browser.evaluate("""[...document.querySelectorAll("tr.run[data-experiment='tune']")]
        .map(r => [r.dataset.kind, r.querySelector('td a').textContent,
                   r.querySelector('td.accuracy').textContent])""")
    assert rows == [["sweep", "2024-04-01T00:00:00+00:00", "0.875"],
                    ["trial", "learning_rate=3e-05, per_replica_batch_size=16", "0.8125"],
                    ["trial", "learning_rate=5e-05, per_replica_batch_size=16", "0.875"]]


def test_a_sweep_s_page_shows_its_best_trial(served, browser, artifact_root, tmp_path):
    """A sweep's page: its best trial's curves, metrics and confusion matrix, the version it
    exported (the card opens) and the gate's verdict; light and dark."""
    base, token = served
    build_artifacts(artifact_root)
    built = build_sweep(artifact_root, tmp_path / "scratch")
    browser.set_cookie("_token", token, base)
    browser.navigate(f"{base}/bertflow/runs/{SWEEP_DAG}/{SWEEP_KEY}")
    browser.wait_js("document.querySelectorAll('svg.chart polyline').length === 3")
    page = browser.evaluate("""(() => ({
        text: document.body.innerText,
        metrics: document.querySelector('p.metrics').innerText,
        exported: document.querySelector('p.exported').innerText,
        card: document.querySelector('p.exported a').href,
        gate: document.querySelector('p.gate').innerText,
        cells: document.querySelectorAll('svg.confusion rect.cell').length}))()""")
    accuracy, f1 = SWEEP_METRICS[2]
    assert page["metrics"] == f"accuracy {accuracy:g}, macro-F1 {f1:g} on 34 examples"
    assert page["exported"].startswith(f"Exported as bert-classifier {SWEEP_VERSION}")
    assert page["gate"].startswith("Quality gate: " + ("passed" if built["gate"]["passed"]
                                                       else "refused"))
    assert "Not evaluated yet" not in page["text"] and "Not exported yet" not in page["text"]
    assert page["cells"] == 9
    assert _fits(browser)["scroll"] <= _fits(browser)["client"]
    _colour_scheme(browser, "light")
    browser.screenshot(tmp_path / "sweep_light.png")
    _colour_scheme(browser, "dark")
    fills = browser.evaluate("""[...document.querySelectorAll('svg.confusion rect.cell')]
        .map(r => getComputedStyle(r).fill)""")
    assert len(set(fills)) > 3  # still shaded by value in dark mode
    browser.screenshot(tmp_path / "sweep_dark.png")
    browser.navigate(page["card"])
    browser.wait_js("document.body && document.body.innerText.length > 0")
    assert SWEEP_VERSION in browser.evaluate("document.body.innerText")
