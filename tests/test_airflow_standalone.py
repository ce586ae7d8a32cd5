"""The DAG through a real Airflow (api-server, scheduler, dag-processor, triggerer as separate
processes) started by the README's third command, `make airflow`, on a free port and a
throwaway AIRFLOW_HOME, and driven only through its REST API and a real headless Chromium:

- the login `make airflow` prints (Airflow's generated one) gets a JWT;
- trigger with a tiny config (the tiny random model of tests/train_helpers.py: Airflow is
  under test, the real checkpoint runs in tests/test_dag_e2e.py), every task succeeds, the
  promote XCom is readable over REST, the exported model serves raw strings in a fresh
  process; a bad Param is refused;
- the "bertflow run" extra links of train/evaluate/export (read over REST) open the run's page
  with the JWT and not without it; the plugin page lists the model; the React trigger form
  shows the Params with their titles, in sections;
- the UI's Backfill option is offered (the default timetable is periodic but never runs by
  itself): a backfill of one experiment over 2 dates, created with the body the UI's form
  sends to POST /api/v2/backfills, each run asking for approval; the first is approved and
  the second rejected through the REST hitlDetails endpoints (a second answer gets 409): the
  first version becomes the champion and stays it; its lineage (card, lineage.json, asset
  event extra, the plugin's version and data pages) matches the run that produced it; a run
  left unanswered for its approval timeout (1 minute) counts as rejected;
- a bert_sweep of 4 trials (2 lengths x 2 learning rates) under max_parallel_trials 2, started
  with the backfill and the unanswered run (bert_finetune runs one at a time; the sweep is
  another DAG, so its trials run while those wait for an answer): every
  mapped instance labelled by its values, tokenize once per length, at most 2 trials holding
  workers at once (and 2 doing so), the best trial exported, and trial 1 the same as the
  plain run above (same config but model_name: same token cache and metrics);
- a new champion is re-scored by itself: bert_batch_score, unpaused before the first run,
  gets a run from each promotion that scores $BERTFLOW_SCORING_INPUT_URI (set for make
  airflow) with the promoted version; the sweep's model (another model_name) is not scored;
- last (the tests run in file order): with a second run's tasks and TensorFlow workers
  running, Ctrl-C stops everything: make exits, and no process started for it is left.

One server per module (~1-2 min to become healthy on a loaded 2-core machine). The browser
checks use Debian's /usr/bin/chromium (`make test-deps` installs it); they fail, not skip,
without it. The UI is driven through the DevTools protocol with `websockets` (tests/ui_helpers).
"""
from __future__ import annotations

import contextlib
import html
import json
import os
import re
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path
from urllib.parse import quote, urljoin, urlsplit

import httpx
import psutil
import pytest

from tasks.config import DEMO_DIR
from tasks.io import storage
from tasks.params_form import SECTIONS
from tasks.io.uris import join_uri, sha256_file
from bertflow_airflow.demo import (predict_in_fresh_process, sample_rows,
                                   scheduler_heartbeat_age)

from train_helpers import tiny_model_dir  # noqa: F401  (fixture)
from ui_helpers import CHROMIUM, Browser, MakeAirflow

DAG_ID = "bert_finetune"
SCORE_DAG_ID = "bert_batch_score"
SCORED_ROWS = 30
TASK_IDS = {"validate", "prepare_data", "tokenize", "provision", "train", "evaluate", "release",
            "export", "gate_eval", "gate", "log_to_mlflow", "promote"}
# and approval: skipped unless require_approval
TINY = {"max_steps": 2, "max_seq_length": 32, "epochs": 1, "per_replica_batch_size": 8}
RUN_TIMEOUT = 12 * 60
# Titles from RunConfig (tasks/config.py) that the trigger form must show.
PARAM_TITLES = ["Training data", "Max sequence length", "Batch size per replica", "Epochs",
                "Max optimizer steps", "Distribution strategy", "Quality-gate metric"]
TRIGGER_DIALOG = ("[...document.querySelectorAll('[role=dialog]')]"
                  ".find(d => d.innerText.includes('Trigger Dag'))")


@pytest.fixture(scope="module")
def scoring_input(tmp_path_factory) -> dict:
    """The data a new champion re-scores: demo texts and one empty text (an error row), named
    to make airflow by $BERTFLOW_SCORING_INPUT_URI (bert_batch_score's input_uri default)."""
    path = tmp_path_factory.mktemp("scoring-input") / "tickets.tsv"
    texts = [line.split("\t")[0] for line in
             (DEMO_DIR / "eval.tsv").read_text().splitlines()[1:SCORED_ROWS + 1]]
    path.write_text("text\tnote\n" + "".join(f"{t}\tx\n" for t in texts) + "  \tx\n")
    return {"uri": str(path), "rows": len(texts), "error_rows": 1}


@pytest.fixture(scope="module")
def server(tmp_path_factory, scoring_input):
    home = tmp_path_factory.mktemp("standalone-home")
    artifacts = tmp_path_factory.mktemp("standalone-artifacts")
    srv = MakeAirflow(home, artifacts,
                      extra_env={"BERTFLOW_SCORING_INPUT_URI": scoring_input["uri"]})
    started = time.monotonic()
    try:
        srv.start()
        print(f"\nmake airflow up on {srv.base} after "
              f"{time.monotonic() - started:.0f}s")
        srv.wait_for(f"DAG {DAG_ID} parsed",
                     lambda: srv.api("GET", f"/dags/{DAG_ID}").status_code == 200, timeout=240,
                     interval=1)
        yield srv
    except BaseException:
        print(srv.log_tail())
        raise
    finally:
        survivors = srv.stop()
        assert not survivors, f"processes left after stopping make airflow: {survivors}"


@pytest.fixture(scope="module")
def triggered_run(server, tiny_model_dir) -> str:  # noqa: F811
    """Unpause and trigger the tiny run; returns the run id (does not wait: the browser
    checks on the trigger form run meanwhile). bert_batch_score is unpaused first: the
    champion this run promotes is re-scored by itself."""
    server.wait_for(f"DAG {SCORE_DAG_ID} parsed",
                    lambda: server.api("GET", f"/dags/{SCORE_DAG_ID}").status_code == 200,
                    timeout=240, interval=1)
    for dag_id in (SCORE_DAG_ID, DAG_ID):
        resp = server.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
        assert resp.status_code == 200, resp.text
        assert resp.json()["is_paused"] is False
    return trigger(server, DAG_ID, {**TINY, "base_model": str(tiny_model_dir)})["dag_run_id"]


def trigger(server, dag_id: str, conf: dict) -> dict:
    """POST a manual run of dag_id with conf; the new run as the REST API returns it."""
    resp = server.api("POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None,
                                                               "conf": conf})
    assert resp.status_code == 200, resp.text
    return resp.json()


@pytest.fixture(scope="module")
def finished_run(server, triggered_run) -> dict:
    run_id = quote(triggered_run, safe="")

    def terminal():
        state = server.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}").json()["state"]
        return state if state in ("success", "failed") else None

    started = time.monotonic()
    state = server.wait_for(f"run {triggered_run} to finish", terminal, timeout=RUN_TIMEOUT,
                            interval=2)
    print(f"\nrun {triggered_run}: {state} after {time.monotonic() - started:.0f}s of polling")
    tis = server.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances").json()
    states = {ti["task_id"]: ti["state"] for ti in tis["task_instances"]}
    if state != "success":
        for task_id, ti_state in states.items():
            if ti_state != "success":
                print(f"---- {task_id}: {ti_state}\n{task_log(server, run_id, task_id)[-4000:]}")
        print(server.log_tail())
    return {"run_id": triggered_run, "quoted": run_id, "state": state, "states": states}


def task_log(server, quoted_run_id: str, task_id: str, try_number: int = 1,
             dag_id: str = DAG_ID) -> str:
    resp = server.api("GET", f"/dags/{dag_id}/dagRuns/{quoted_run_id}/taskInstances/{task_id}"
                             f"/logs/{try_number}", params={"full_content": "true"},
                      headers={"Accept": "application/json"})
    if resp.status_code != 200:
        return f"(log: HTTP {resp.status_code} {resp.text[:300]})"
    content = resp.json().get("content", [])
    return "\n".join(c.get("event", "") if isinstance(c, dict) else str(c) for c in content)


# --- REST -------------------------------------------------------------------------------

def test_the_printed_login_is_airflows_generated_one_and_gets_a_token(server):
    generated = server.home / "simple_auth_manager_passwords.json.generated"
    assert json.loads(generated.read_text()) == {server.user: server.password}
    assert server.token.count(".") == 2  # a JWT from POST /auth/token
    assert httpx.get(f"{server.base}/api/v2/dags", timeout=30).status_code == 401


def test_bad_param_is_refused_at_trigger_naming_the_field(server):
    """Airflow 3.3 validates the conf against the DAG's Params (JSON schema from RunConfig)
    when the run is created: HTTP 400, no run."""
    before = server.api("GET", f"/dags/{DAG_ID}/dagRuns").json()["total_entries"]
    resp = server.api("POST", f"/dags/{DAG_ID}/dagRuns",
                      json={"logical_date": None, "conf": {**TINY, "per_replica_batch_size": 0}})
    assert resp.status_code == 400, resp.text
    detail = resp.json()["detail"]
    assert "per_replica_batch_size" in detail and "minimum" in detail, detail
    assert server.api("GET", f"/dags/{DAG_ID}/dagRuns").json()["total_entries"] == before


# --- browser: the trigger form (checked while the triggered DAG trains) ------------------

def test_chromium_is_installed():
    assert os.access(CHROMIUM, os.X_OK), (
        f"{CHROMIUM} missing: run `make test-deps` (apt-get install -y chromium)")


def read_trigger_form(server, dag_id: str, first_title: str, shot: Path) -> dict:
    """Open the DAG page logged in as the real user (the api-server accepts the JWT from
    POST /auth/token as the `_token` cookie), click Trigger, screenshot the form and read
    every section's text, whether Trigger is enabled and which required fields are empty."""
    assert os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} missing: run `make test-deps`"
    dialog = TRIGGER_DIALOG
    browser = Browser()
    try:
        browser.set_cookie("_token", server.token, server.base + "/")
        browser.navigate(f"{server.base}/dags/{dag_id}")
        button = ("[...document.querySelectorAll('button')]"
                  ".find(b => b.getAttribute('aria-label') === 'Trigger Dag')")
        browser.wait_js(f"!!{button}", timeout=120)
        browser.evaluate(f"{button}.click()")
        # The form opens on its first section (the first-time fields); the rest are closed.
        browser.wait_js(f"!!{dialog} && {dialog}.innerText.includes("
                        f"{json.dumps(first_title)})", timeout=90)
        time.sleep(1)  # let the fields lay out before the screenshot
        first_text = browser.evaluate(f"{dialog}.innerText")
        browser.screenshot(shot)
        # Open the sections one by one (one is open at a time) to read every field.
        triggers = (f"[...{dialog}.querySelectorAll("
                    "'[data-scope=accordion][data-part=item-trigger]')]")
        text = first_text
        for i in range(browser.evaluate(f"{triggers}.length")):
            if browser.evaluate(f"{triggers}[{i}].getAttribute('aria-expanded')") != "true":
                browser.click(f"{triggers}[{i}]")
                browser.wait_js(f"{triggers}[{i}].getAttribute('aria-expanded') === 'true'",
                                timeout=15)
                time.sleep(0.7)  # the section's content slides open
            text += "\n" + browser.evaluate(f"{dialog}.innerText")
        submit = browser.evaluate(
            f"[...{dialog}.querySelectorAll('button')]"
            ".filter(b => b.innerText.trim() === 'Trigger').map(b => b.disabled)")
        # Fields the form marks required (*) but leaves empty: why Trigger is disabled.
        empty_required = browser.evaluate(f"""(() => {{
            const out = [];
            for (const el of {dialog}.querySelectorAll('input, textarea')) {{
                if (['checkbox', 'radio', 'hidden'].includes(el.type) || el.value !== ''
                    || el.offsetParent === null || el.getAttribute('role') === 'combobox'
                    || el.closest('[data-scope=combobox],[data-scope=select]')) continue;
                let row = el.parentElement;
                while (row && !row.querySelector('label')) row = row.parentElement;
                const label = row && row.querySelector('label');
                if (label && label.innerText.includes('*'))
                    out.push(label.innerText.replace('*', '').trim());
            }}
            return out; }})()""")
    finally:
        browser.close()
    print(f"\ntrigger form screenshot: {shot}")
    return {"text": text, "first_text": first_text, "submit_disabled": submit,
            "empty_required": empty_required, "screenshot": shot}


@pytest.fixture(scope="module")
def trigger_form(server, triggered_run, tmp_path_factory) -> dict:
    shot = tmp_path_factory.mktemp("screens") / "trigger_form.png"
    return read_trigger_form(server, DAG_ID, PARAM_TITLES[0], shot)


def test_trigger_form_shows_params_with_titles(trigger_form):
    text = trigger_form["text"]
    assert f"Trigger Dag - {DAG_ID}" in text
    for title in PARAM_TITLES:
        assert title in text, f"trigger form lacks the Param title {title!r}"
    assert "Stop after this many steps; 0 means run all epochs." in text  # a description
    # The form is in sections, in tasks.params_form.SECTIONS order; only the first (the fields a
    # first-time user changes) is open when the form appears.
    first = trigger_form["first_text"]
    lines = [line.strip() for line in first.splitlines()]
    # A section's heading is a line of its own (its last one: "Workers" is also a field).
    positions = [max((i for i, line in enumerate(lines) if line == section), default=-1)
                 for section in SECTIONS]
    assert min(positions) >= 0 and positions == sorted(positions), positions
    assert "Training data" in first and "Epochs" in first and "Allowed labels" in first
    assert "Max sequence length" not in first  # in the closed "Model" section
    shot: Path = trigger_form["screenshot"]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 50_000, shot.stat().st_size  # a blank page is ~5 kB


def test_trigger_form_can_be_submitted_with_the_defaults(trigger_form):
    """Every Param has a valid default, so the form's Trigger button must be enabled."""
    assert trigger_form["submit_disabled"] == [False], (
        f"Trigger button disabled with the default Params; required-but-empty fields: "
        f"{trigger_form['empty_required']}")


def test_run_succeeds_with_every_task(finished_run):
    assert finished_run["states"] == {**{t: "success" for t in TASK_IDS},
                                      "approval": "skipped"}, finished_run["states"]
    assert finished_run["state"] == "success"


def test_promote_result_is_readable_over_rest(server, finished_run):
    assert finished_run["state"] == "success"
    base = f"/dags/{DAG_ID}/dagRuns/{finished_run['quoted']}/taskInstances"
    resp = server.api("GET", f"{base}/promote/xcomEntries/return_value")
    assert resp.status_code == 200, resp.text
    promoted = resp.json()["value"]
    assert promoted["promoted"] is True, promoted  # first model: gate minimum 0
    resp = server.api("GET", f"{base}/export/xcomEntries/return_value")
    assert resp.status_code == 200, resp.text
    export_manifest = storage.read_json(resp.json()["value"])
    assert export_manifest["version_uri"].startswith(str(server.artifact_root))


def _run_uri(server, finished_run) -> str:
    resp = server.api("GET", f"/dags/{DAG_ID}/dagRuns/{finished_run['quoted']}/taskInstances"
                             "/validate/xcomEntries/return_value")
    assert resp.status_code == 200, resp.text
    return resp.json()["value"]


def test_extra_links_over_rest_open_the_run_page(server, finished_run):
    """The "bertflow run" operator extra link as the UI gets it: the REST API reads the link
    the worker stored when each task ended. It points at the run's page, which the api-server
    serves with the JWT and refuses without it."""
    assert finished_run["state"] == "success"
    run_uri = _run_uri(server, finished_run)
    run_key = run_uri.rstrip("/").rsplit("/", 1)[1]
    expected = f"/bertflow/runs/{DAG_ID}/{run_key}"
    links = {}
    for task_id in ("train", "evaluate", "export"):
        resp = server.api("GET", f"/dags/{DAG_ID}/dagRuns/{finished_run['quoted']}"
                                 f"/taskInstances/{task_id}/links")
        assert resp.status_code == 200, resp.text
        links[task_id] = resp.json()["extra_links"].get("bertflow run")
        assert links[task_id] and urlsplit(links[task_id]).path == expected, (task_id, links)
    url = urljoin(server.base + "/", links["export"])
    page = httpx.get(url, headers={"Authorization": f"Bearer {server.token}"}, timeout=60)
    assert page.status_code == 200, page.text[:500]
    assert f"<h2>Run {DAG_ID} / {html.escape(run_key)}</h2>" in page.text
    assert html.escape(finished_run["run_id"]) in page.text  # the run id in its config table
    assert html.escape(run_uri) in page.text
    assert httpx.get(url, timeout=30).status_code in (401, 403)
    assert httpx.get(url, headers={"Authorization": "Bearer x.y.z"},
                     timeout=30).status_code in (401, 403)


def test_exported_model_predicts_raw_strings_in_a_fresh_process(server, finished_run):
    assert finished_run["state"] == "success"
    run_uri = _run_uri(server, finished_run)
    exported = storage.read_json(join_uri(run_uri, "export", "manifest.json"))
    labels = storage.read_json(join_uri(exported["version_uri"], "labels.json"))
    rows = sample_rows(run_uri, count=2) + [{"text": "completely unrelated words"}]
    predictions = predict_in_fresh_process(join_uri(exported["version_uri"], "saved_model"),
                                           rows)
    assert len(predictions) == 3
    for pred in predictions:
        assert pred["label"] in labels
        assert sum(pred["probabilities"]) == pytest.approx(1.0, abs=1e-3)


# --- browser: the plugin page -----------------------------------------------------------

def test_plugin_page_lists_the_exported_model(server, finished_run):
    assert finished_run["state"] == "success"
    manifest_uri = server.api("GET", f"/dags/{DAG_ID}/dagRuns/{finished_run['quoted']}"
                                     "/taskInstances/export/xcomEntries/return_value"
                              ).json()["value"]
    exported = storage.read_json(manifest_uri)
    # Behind Airflow's login: anonymous is refused, the logged-in browser sees the page.
    assert httpx.get(f"{server.base}/bertflow/", timeout=30).status_code == 401
    browser = Browser()
    try:
        browser.set_cookie("_token", server.token, server.base + "/")
        browser.navigate(f"{server.base}/bertflow/")
        browser.wait_js("document.body && document.body.innerText.includes('Models')",
                        timeout=60)
        dom = browser.evaluate("document.documentElement.outerHTML")
    finally:
        browser.close()
    assert "<h3>Models</h3>" in dom
    assert exported["version_uri"] in dom, dom[:2000]
    assert f"/{exported['version']}/card" in dom


# --- backfill from the UI's form, approval, lineage ------------------------------------------

BACKFILL_DATES = ["2024-03-01T00:00:00Z", "2024-03-02T00:00:00Z"]
SWEEP_SPACE = {"grid": {"max_seq_length": [32, 16], "learning_rate": [5e-5, 3e-5]}}
APPROVAL_CONF = {**TINY, "experiment": "approval", "require_approval": True,
                 "gate_max_regression": 1.0}  # the gate passes: the person decides


@pytest.fixture(scope="module")
def second_wave(server, finished_run, first_rescore, tiny_model_dir) -> dict:  # noqa: F811
    """Everything after the first run is started at once, as a team would: the backfill, the
    run left unanswered and the sweep (another DAG, so it runs beside them). bert_finetune
    runs one at a time (max_active_runs 1): the sweep's trials fill the waits for approval.
    After the first run's re-score: its task writes made SQLite refuse the backfill 10 times
    in a row on a loaded machine."""
    wave = {"backfill": _create_backfill(server, tiny_model_dir)}
    wave["unanswered"] = trigger(server, DAG_ID, {
        **APPROVAL_CONF, "base_model": str(tiny_model_dir), "approval_timeout_minutes": 1})
    assert server.api("PATCH", "/dags/bert_sweep", json={"is_paused": False}).status_code == 200
    wave["sweep"] = trigger(server, "bert_sweep", {
        **TINY, "base_model": str(tiny_model_dir), "model_name": "swept",
        "search_space": SWEEP_SPACE, "max_parallel_trials": 2})
    return wave


@pytest.fixture(scope="module")
def backfill(second_wave) -> dict:
    return second_wave["backfill"]


def _create_backfill(server, tiny_model_dir) -> dict:  # noqa: F811
    """After the first run (its version is the champion), the backfill the UI's Backfill form
    creates: the fields its createBackfill call sends (airflow/ui, max_active_runs 1 as the
    form's default), one experiment over 2 dates, each run asking for approval."""
    dag = server.api("GET", f"/dags/{DAG_ID}").json()
    body = {"dag_id": DAG_ID, "from_date": BACKFILL_DATES[0], "to_date": BACKFILL_DATES[1],
            "dag_run_conf": {**APPROVAL_CONF, "base_model": str(tiny_model_dir)},
            "max_active_runs": 1, "reprocess_behavior": "none", "run_backwards": False,
            "run_on_latest_version": True}
    # On SQLite (what make airflow runs on) Airflow answers 503 "Database is locked" when
    # another process writes at that moment, having rolled back what it began: a user clicks
    # Run Backfill again. Count the attempts; any other answer fails at once. Retried for
    # two minutes: at load 15-19 on 2 cores one run took 8 attempts 3 s apart.
    refusals, deadline = [], time.monotonic() + 120
    while True:
        resp = server.api("POST", "/backfills", json=body)
        if resp.status_code != 503 or time.monotonic() > deadline:
            break
        refusals.append(resp.json()["detail"])
        time.sleep(3)
    print(f"\nbackfill created after {len(refusals)} 503 answer(s): {refusals[:1]}")
    assert resp.status_code == 200, (resp.text, refusals)
    runs = [r for r in server.api("GET", f"/dags/{DAG_ID}/dagRuns",
                                  params={"limit": 100}).json()["dag_runs"]]
    return {"dag": dag, "backfill": resp.json(), "all_runs": runs,
            "runs": sorted((r for r in runs if r["run_type"] == "backfill"),
                           key=lambda r: r["logical_date"])}


def test_backfill_is_offered_and_makes_one_run_per_date(backfill):
    dag = backfill["dag"]
    assert dag["is_backfillable"] is True and dag["timetable_periodic"] is True, dag
    assert "backfills only" in dag["timetable_summary"], dag["timetable_summary"]
    assert dag["next_dagrun_run_after"] is None  # nothing of its own to schedule
    assert [r["logical_date"][:10] for r in backfill["runs"]] == ["2024-03-01", "2024-03-02"]
    assert all(r["conf"]["experiment"] == "approval" for r in backfill["runs"])
    # Unpaused since the first run, minutes ago: the scheduler made no run by itself.
    assert [r for r in backfill["all_runs"] if r["run_type"] == "scheduled"] == []


def _await_approval(server, run: dict) -> dict:
    """The run's approval request once its approval task waits (GET .../hitlDetails)."""
    run_id = quote(run["dag_run_id"], safe="")

    def waiting():
        runs = server.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}").json()
        assert runs["state"] not in ("failed", "success"), runs  # it must stop to ask
        details = server.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/hitlDetails").json()
        return next((d for d in details["hitl_details"]
                     if d["task_instance"]["task_id"] == "approval"), None)

    detail = server.wait_for(f"{run['dag_run_id']} to ask for approval", waiting,
                             timeout=RUN_TIMEOUT, interval=2)
    detail["ti_state"] = server.api(
        "GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/approval").json()["state"]
    return detail


def _answer(server, run: dict, option: str, first: bool = True) -> httpx.Response:
    # Not before the scheduler has processed the executor's report of the paused workload: an
    # answer that resumes the task earlier makes Airflow 3.3 read that report as "finished
    # with state success, but the task instance's state is queued" and retry the task, which
    # asks again (seen in CI with answers 0.4 s and 5.2 s after the request; the loaded
    # scheduler took 5.9 s to process the report). The REST API shows nothing of it; the
    # scheduler's log line for the report does. A second answer resumes nothing: no wait.
    if first:
        _await_report_processed(server, run)
    return server.api("PATCH", f"/dags/{DAG_ID}/dagRuns/{quote(run['dag_run_id'], safe='')}"
                               "/taskInstances/approval/-1/hitlDetails",
                      json={"chosen_options": [option], "params_input": {}})


def _await_report_processed(server, run: dict) -> None:
    """Until the scheduler has logged its processing of the executor's report that the
    approval task's worker ended with the task parked (_process_executor_events' "TaskInstance
    Finished" line, state awaiting_input): from then on the report is out of its event
    buffer, and an answer's resume cannot be taken for it."""
    try_number = server.api("GET", f"/dags/{DAG_ID}/dagRuns/{quote(run['dag_run_id'], safe='')}"
                                   "/taskInstances/approval").json()["try_number"]
    line = re.compile(rf"TaskInstance Finished: dag_id={DAG_ID}, task_id=approval, "
                      rf"run_id={re.escape(run['dag_run_id'])}, .* state=awaiting_input, "
                      rf"executor=.*, executor_state=success, try_number={try_number},")
    started = time.monotonic()
    server.wait_for(f"the scheduler to process {run['dag_run_id']}'s parked approval",
                    lambda: line.search(server.log_path.read_text(errors="replace")),
                    timeout=180, interval=0.5)
    print(f"\n{run['dag_run_id']}: the scheduler processed the parked approval's report "
          f"{time.monotonic() - started:.1f}s after the request was seen")


def _finish(server, run: dict) -> dict:
    run_id = quote(run["dag_run_id"], safe="")

    def terminal():
        state = server.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}").json()["state"]
        return state if state in ("success", "failed") else None

    state = server.wait_for(f"{run['dag_run_id']} to finish", terminal, timeout=RUN_TIMEOUT,
                            interval=2)
    tis = server.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances").json()
    states = {ti["task_id"]: ti["state"] for ti in tis["task_instances"]}
    run_uri = server.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/validate"
                                "/xcomEntries/return_value").json()["value"]
    if state != "success":
        for task_id, ti_state in states.items():
            if ti_state != "success":
                print(f"---- {task_id}: {ti_state}\n{task_log(server, run_id, task_id)[-4000:]}")
    return {"state": state, "states": states, "run_uri": run_uri, "quoted": run_id,
            "export": storage.read_json(join_uri(run_uri, "export", "manifest.json")),
            "promote": storage.read_json(join_uri(run_uri, "promote", "manifest.json"))}


def _champion(server) -> dict:
    return storage.read_json(join_uri(str(server.artifact_root), "models", "bert-classifier",
                                      "CHAMPION.json"))


@pytest.fixture(scope="module")
def approved(server, backfill) -> dict:
    run = backfill["runs"][0]
    before = _champion(server)
    request = _await_approval(server, run)
    resp = _answer(server, run, "Approve")
    assert resp.status_code == 200, resp.text
    return {"run": run, "request": request, "answer": resp.json(),
            "champion_before": before, **_finish(server, run)}


def test_approval_shows_the_candidate_next_to_the_champion(server, approved):
    request, before = approved["request"], approved["champion_before"]
    assert request["ti_state"] == "awaiting_input"  # no worker slot while it waits
    assert request["options"] == ["Approve", "Reject"] and request["defaults"] == ["Reject"]
    gate = storage.read_json(join_uri(approved["run_uri"], "gate", "manifest.json"))
    # Both models scored on the same test rows by gate_eval, with the paired interval.
    d = gate["comparison"]["difference"]
    assert gate["comparison"]["champion"]["version"] == before["version"]
    assert request["subject"] == (
        f"Promote bert-classifier {gate['version']}? accuracy {d['candidate']:.4f} vs "
        f"champion {before['version']} {d['champion']:.4f}, {d['difference']:+.4f} "
        f"[{d['low']:+.4f}, {d['high']:+.4f}]")
    body = request["body"]
    assert f"| accuracy | {d['candidate']:.4f} | {d['champion']:.4f} |" in body
    assert f"same {gate['comparison']['units']:,} test rows" in body
    run_key = approved["run_uri"].rstrip("/").rsplit("/", 1)[1]
    assert f"/bertflow/runs/{DAG_ID}/{run_key})" in body  # the run's page


def test_an_approved_model_is_promoted(server, approved):
    assert approved["state"] == "success", approved["states"]
    assert approved["states"]["approval"] == "success"
    assert approved["answer"]["chosen_options"] == ["Approve"]
    promote = approved["promote"]
    assert promote["promoted"] is True and f"approved by {server.user}" in promote["reason"]
    assert _champion(server)["version"] == approved["export"]["version"]


@pytest.fixture(scope="module")
def rejected(server, backfill, approved) -> dict:
    run = backfill["runs"][1]
    _await_approval(server, run)
    resp = _answer(server, run, "Reject")
    assert resp.status_code == 200, resp.text
    again = _answer(server, run, "Approve", first=False)
    return {"second_answer": again, **_finish(server, run)}


def test_a_rejected_model_leaves_the_champion_and_the_run_says_why(server, approved, rejected):
    assert rejected["second_answer"].status_code == 409, rejected["second_answer"].text
    assert rejected["state"] == "success", rejected["states"]
    assert rejected["states"]["promote"] == "success"  # it ran, to record why
    promote = rejected["promote"]
    assert promote["promoted"] is False and promote["reason"].startswith(
        f"rejected by {server.user} at "), promote
    assert _champion(server)["version"] == approved["export"]["version"]
    assert "not promoted: rejected by" in task_log(server, rejected["quoted"], "promote")
    run_key = rejected["run_uri"].rstrip("/").rsplit("/", 1)[1]
    page = httpx.get(f"{server.base}/bertflow/runs/{DAG_ID}/{run_key}", timeout=60,
                     headers={"Authorization": f"Bearer {server.token}"}).text
    assert f"({html.escape(promote['reason'])})" in page  # the run page says why


def test_lineage_matches_the_run_that_produced_the_version(server, finished_run, approved,
                                                            rejected):
    from tasks.runs import lineage

    run_uri, version_uri = approved["run_uri"], approved["export"]["version_uri"]
    record = storage.read_json(join_uri(version_uri, "lineage.json"))
    data = storage.read_json(join_uri(run_uri, "data", "manifest.json"))
    tokens = storage.read_json(join_uri(run_uri, "tokenize", "manifest.json"))
    train = storage.read_json(join_uri(run_uri, "train", "manifest.json"))
    metrics = storage.read_json(join_uri(run_uri, "evaluate", "metrics.json"))
    assert record["data"]["train"]["sha256"] == data["sources"]["train"]["sha256"]
    assert record["data"]["train"]["uri"] == data["sources"]["train"]["uri"]
    # Each source the data step read, eval included when given (else a split of train).
    assert {s for s, src in data["sources"].items() if src} == set(record["data"])
    assert all(record["data"][s]["sha256"] == data["sources"][s]["sha256"] for s in record["data"])
    assert record["eval_source"] == data.get("eval_source")
    assert record["tfrecord_cache_key"] == tokens["content_hash"]
    assert record["config"] == storage.read_json(join_uri(run_uri, "config.json"))
    assert record["config"]["require_approval"] is True
    weights = next(Path(train["base_model"]) / n for n in lineage.WEIGHT_FILES
                   if (Path(train["base_model"]) / n).is_file())
    assert record["base_model"]["sha256"] == sha256_file(weights)
    assert record["base_model"]["source"] == train["base_checkpoint"]["source"]
    # The worker's checkout: this one, at HEAD or an ancestor (a commit made meanwhile).
    assert record["code"]["bertflow"] == lineage.code_version()["bertflow"]
    assert subprocess.run(["git", "merge-base", "--is-ancestor", record["code"]["git_commit"],
                           "HEAD"], cwd=lineage.PROJECT_ROOT).returncode == 0, record["code"]
    assert record["run_id"] == approved["run"]["dag_run_id"]
    assert record["metrics"]["accuracy"] == metrics["accuracy"]
    card = storage.read_text(join_uri(version_uri, "model_card.md"))
    assert data["sources"]["train"]["sha256"] in card and tokens["content_hash"] in card
    # The promoted asset event carries the same record.
    events = server.api("GET", "/assets/events", params={
        "source_dag_id": DAG_ID, "source_run_id": approved["run"]["dag_run_id"]}).json()
    versions = [e["extra"]["version"] for e in events["asset_events"]]
    assert versions == [approved["export"]["version"]], events
    extra = events["asset_events"][0]["extra"]
    # Airflow's secrets masker hides values under sensitive key names in the extra: of the
    # record, only the config's service_account.
    assert extra["config"] == {**record["config"], "service_account": "***"}
    assert {k: extra[k] for k in record if k != "config"} == \
        {k: v for k, v in record.items() if k != "config"}
    # The page: version N's data, and every version from that data (all three runs here).
    auth = {"Authorization": f"Bearer {server.token}"}
    page = httpx.get(f"{server.base}/bertflow/models/bert-classifier/"
                     f"{approved['export']['version']}", headers=auth, timeout=60).text
    assert data["sources"]["train"]["sha256"] in page and html.escape(record["run_id"]) in page
    found = httpx.get(f"{server.base}/bertflow/data", headers=auth, timeout=60,
                      params={"q": data["sources"]["train"]["sha256"]}).text
    first = storage.read_json(join_uri(_run_uri(server, finished_run), "export",
                                       "manifest.json"))
    for version in (first["version"], approved["export"]["version"],
                    rejected["export"]["version"]):
        assert f"bert-classifier {version}</a>" in found, version


def test_no_answer_in_time_counts_as_a_rejection(server, second_wave, approved, rejected):
    """A run left unanswered for its approval_timeout_minutes (1): the scheduler's timeout sweep
    answers with the default, Reject, and the run says it timed out."""
    done = _finish(server, second_wave["unanswered"])
    assert done["states"]["approval"] == "success"  # it asked, and the timeout answered
    assert done["state"] == "success", done["states"]
    assert done["promote"]["promoted"] is False
    assert done["promote"]["reason"] == ("no approval within approval_timeout_minutes 1: "
                                         "counted as rejected; the champion stays")
    assert done["promote"]["approval"]["timed_out"] is True
    detail = server.api("GET", f"/dags/{DAG_ID}/dagRuns/{done['quoted']}/hitlDetails").json()
    answer = detail["hitl_details"][0]
    assert answer["chosen_options"] == ["Reject"] and answer["responded_by_user"] is None
    assert _champion(server)["version"] == approved["export"]["version"]


# --- a sweep: 4 trials, at most 2 at once --------------------------------------------------

TRIAL_STEPS = ("wait_for_slot", "provision", "train", "release")


@pytest.fixture(scope="module")
def sweep_run(server, second_wave) -> dict:
    """bert_sweep over the tiny run's config (trial 1 is exactly finished_run's config but
    for model_name), 2 lengths x 2 learning rates, max_parallel_trials 2."""
    run_id = quote(second_wave["sweep"]["dag_run_id"], safe="")
    base = f"/dags/bert_sweep/dagRuns/{run_id}"

    def terminal():
        state = server.api("GET", base).json()["state"]
        return state if state in ("success", "failed") else None

    state = server.wait_for("the sweep to finish", terminal, timeout=RUN_TIMEOUT, interval=2)
    tis = server.api("GET", f"{base}/taskInstances", params={"limit": 100}).json()
    for t in sorted(tis["task_instances"], key=lambda t: (t["map_index"], t["start_date"] or "")):
        print(f"{t['task_id']:22} {t['map_index']:2} {t['state']:16} try {t['try_number']} "
              f"{t['start_date']} {t['end_date']}")
    sweep_uri = server.api("GET", f"{base}/taskInstances/validate/xcomEntries/sweep_uri")
    assert sweep_uri.status_code == 200, sweep_uri.text
    return {"state": state, "tis": tis["task_instances"], "sweep_uri": sweep_uri.json()["value"]}


def test_sweep_trials_are_mapped_tasks_labelled_by_their_values(sweep_run):
    assert sweep_run["state"] == "success", [(t["task_id"], t["map_index"], t["state"])
                                             for t in sweep_run["tis"]]
    labels = {(t["task_id"], t["rendered_map_index"]) for t in sweep_run["tis"]
              if t["map_index"] >= 0 and t["state"] == "success"}
    for task in TRIAL_STEPS:
        for length in (32, 16):
            for rate in ("5e-05", "3e-05"):
                assert (f"trial.{task}", f"max_seq_length={length} learning_rate={rate}") \
                    in labels, labels
    # The data step ran once and tokenize once per distinct max_seq_length.
    assert {t["task_id"]: t["map_index"] for t in sweep_run["tis"]}["prepare_data"] == -1
    assert {r for t, r in labels if t == "tokenize"} == {"max_seq_length=32",
                                                        "max_seq_length=16"}


def test_sweep_never_runs_more_trials_at_once_than_its_cap(sweep_run):
    """A trial holds workers from its provision's start to its release's end."""
    from datetime import datetime

    spans: dict[int, list] = {}
    for t in sweep_run["tis"]:
        if t["task_id"] in ("trial.provision", "trial.release") and t["state"] == "success":
            spans.setdefault(t["map_index"], []).append(
                datetime.fromisoformat(t["start_date" if t["task_id"] == "trial.provision"
                                         else "end_date"]))
    assert len(spans) == 4 and all(len(s) == 2 for s in spans.values()), spans
    edges = sorted([(min(s), 1) for s in spans.values()] + [(max(s), -1) for s in spans.values()])
    running = peak = 0
    for _, step in edges:  # an end sorts before a start at the same instant
        running += step
        peak = max(peak, running)
    assert peak == 2, spans  # the cap was reached and never passed


def test_sweep_exports_the_best_trial_and_its_first_trial_is_the_plain_run(server, sweep_run,
                                                                           finished_run):
    best = storage.read_json(join_uri(sweep_run["sweep_uri"], "best", "manifest.json"))
    ranked = sorted(best["trials"], key=lambda r: (-r["validation"], r["index"]))
    assert best["best"]["index"] == ranked[0]["index"] and best["ranked_on"] == "validation"
    trial = best["best"]["run_uri"]
    exported = storage.read_json(join_uri(trial, "export", "manifest.json"))
    assert exported["version_uri"].startswith(join_uri(str(server.artifact_root), "models",
                                                       "swept"))
    assert storage.read_json(join_uri(exported["version_uri"], "lineage.json"))[
        "run_key"] == best["best"]["run_key"]
    first, plain = best["trials"][0]["run_uri"], _run_uri(server, finished_run)
    ours, theirs = (storage.read_json(join_uri(r, "config.json")) for r in (first, plain))
    # A sweep holds out validation rows and its trials never read the test rows.
    assert {k for k in ours if ours[k] != theirs[k]} == {"model_name", "validation_fraction",
                                                        "evaluate_in_train"}
    # Validation comes out of the training rows only: the test rows are the plain run's.
    splits = [storage.read_json(join_uri(r, "data", "manifest.json"))["splits"]
              for r in (first, plain)]
    assert splits[0]["eval"]["label_counts"] == splits[1]["eval"]["label_counts"]
    assert splits[0]["validation"]["num_examples"] > 0 and "validation" not in splits[1]
    # Only the chosen trial was evaluated on test, in a process of its own.
    for row in best["trials"]:
        evaluated = join_uri(row["run_uri"], "evaluate", "manifest.json")
        assert storage.exists(evaluated) == (row["index"] == best["best"]["index"])
    assert storage.read_json(join_uri(trial, "evaluate", "manifest.json"))[
        "evaluated_in"] == "evaluate"


def test_sweep_trigger_form_opens_on_the_search_space_and_submits_with_the_defaults(
        server, tmp_path_factory):
    form = read_trigger_form(server, "bert_sweep", "Search space",
                             tmp_path_factory.mktemp("screens") / "sweep_form.png")
    first = form["first_text"]
    assert "Trigger Dag - bert_sweep" in first
    for title in ("Search space", "Trials at once", "Training data", "Epochs"):
        assert title in first, f"the sweep form's first box lacks {title!r}"
    assert "How many trials hold workers at the same time" in first
    assert "Max sequence length" in form["text"]  # every bert_finetune Param, in sections
    assert form["submit_disabled"] == [False], form["empty_required"]


# --- a new champion is re-scored by itself ------------------------------------------------

def _promotions(server, dag_id: str, run_id: str) -> list[dict]:
    """The asset events run_id of dag_id emitted (its promote's, when it promoted)."""
    return server.api("GET", "/assets/events", params={
        "source_dag_id": dag_id, "source_run_id": run_id}).json()["asset_events"]


def _rescores(server, run_id: str, dag_id: str = DAG_ID) -> list[dict]:
    """The bert_batch_score runs the scheduler made from run_id's promotion, once finished,
    each with its task states and triggering events."""
    def made():
        return [r["run_id"] for e in _promotions(server, dag_id, run_id)
                for r in e["created_dagruns"] if r["dag_id"] == SCORE_DAG_ID] or None

    found = []
    for score_run in server.wait_for(f"a {SCORE_DAG_ID} run made from {run_id}'s promotion",
                                     made, timeout=300, interval=2):
        base = f"/dags/{SCORE_DAG_ID}/dagRuns/{quote(score_run, safe='')}"

        def terminal():
            run = server.api("GET", base).json()
            return run if run["state"] in ("success", "failed") else None

        run = server.wait_for(f"{score_run} to finish", terminal, timeout=RUN_TIMEOUT,
                              interval=2)
        tis = server.api("GET", f"{base}/taskInstances").json()["task_instances"]
        run["states"] = {ti["task_id"]: ti["state"] for ti in tis}
        for ti in tis:
            if ti["state"] not in ("success", "skipped"):
                print(f"---- {SCORE_DAG_ID} {ti['task_id']}: {ti['state']}\n" + task_log(
                    server, quote(score_run, safe=""), ti["task_id"], max(ti["try_number"], 1),
                    dag_id=SCORE_DAG_ID)[-6000:])
        run["events"] = server.api("GET", f"{base}/upstreamAssetEvents").json()["asset_events"]
        publish = server.api("GET", f"{base}/taskInstances/publish/xcomEntries/return_value")
        run["summary"] = publish.json()["value"] if publish.status_code == 200 else None
        found.append(run)
    return found


def _check_rescored(server, run: dict, version: str, scoring_input: dict) -> dict:
    """run scored the configured input with `version`: one row per input row."""
    assert run["run_type"] == "asset_triggered" and run["state"] == "success", run
    assert run["states"] == {"validate": "success", "score": "success",
                             "publish": "success", "release": "success"}, run["states"]
    complete = storage.read_json(join_uri(run["summary"]["output_uri"], "_COMPLETE.json"))
    assert complete["model"]["version"] == version
    assert [i["uri"] for i in complete["inputs"]] == [scoring_input["uri"]]
    assert (complete["rows"], complete["error_rows"], complete["input_rows"]) == (
        scoring_input["rows"], scoring_input["error_rows"],
        scoring_input["rows"] + scoring_input["error_rows"])
    assert sum(f["rows"] for f in complete["files"]) == scoring_input["rows"]
    return complete


@pytest.fixture(scope="module")
def first_rescore(server, finished_run) -> list[dict]:
    """The bert_batch_score runs made from the first run's promotion, once finished."""
    return _rescores(server, finished_run["run_id"])


def test_a_promoted_champion_is_rescored_by_itself(server, finished_run, first_rescore,
                                                   scoring_input):
    """bert_finetune's promote emits the promoted-model event; the scheduler, by itself, makes
    a bert_batch_score run that scores $BERTFLOW_SCORING_INPUT_URI with that version."""
    assert finished_run["state"] == "success"
    exported = storage.read_json(join_uri(_run_uri(server, finished_run), "export",
                                          "manifest.json"))
    (run,) = first_rescore
    assert [(e["name"], e["extra"]["version"]) for e in run["events"]] == [
        ("bertflow-model-bert-classifier", exported["version"])]
    complete = _check_rescored(server, run, exported["version"], scoring_input)
    assert complete["model"]["version_uri"] == exported["version_uri"]


def test_only_this_models_promotions_are_rescored(server, second_wave, backfill, approved,
                                                   rejected, sweep_run, scoring_input):
    """The approved run's champion is re-scored with its own version; the sweep's model
    ("swept") is another model_name: a run that only its promotion triggered skips (nothing
    of it to re-score); a rejected run promotes nothing and makes no run."""
    assert approved["state"] == "success" and sweep_run["state"] == "success"
    (run,) = _rescores(server, approved["run"]["dag_run_id"])
    _check_rescored(server, run, approved["export"]["version"], scoring_input)
    assert _promotions(server, DAG_ID, backfill["runs"][1]["dag_run_id"]) == []  # rejected
    (swept,) = _rescores(server, second_wave["sweep"]["dag_run_id"], dag_id="bert_sweep")
    names = sorted(e["name"] for e in swept["events"])
    if names == ["bertflow-model-swept"]:
        assert swept["state"] == "success" and swept["summary"] is None, swept
        assert set(swept["states"].values()) == {"skipped"}, swept["states"]
    else:  # queued with the approved promotion (a score run was running): that one scored
        assert swept["dag_run_id"] == run["dag_run_id"], names
    print(f"\nthe sweep's promotion made {swept['dag_run_id']} (events {names}): "
          f"{swept['states']}")


# --- a scheduler that exits is started again -----------------------------------------------

def _schedulers(server) -> dict[int, float]:
    """pid -> start time of every `airflow scheduler` process of this server (without the
    LocalExecutor's workers, forks that share its command line)."""
    found = {}
    for pid in server._our_pids():
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if proc.cmdline()[-1:] == ["scheduler"] and proc.status() != psutil.STATUS_ZOMBIE \
                    and proc.parent().cmdline()[-1:] != ["scheduler"]:
                found[pid] = proc.create_time()
    return found


def _process_table(server) -> str:
    """Every process of this server: pid, parent, state, start time, command line."""
    rows = []
    for pid in sorted(server._our_pids()):
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            rows.append(f"{pid} ppid={proc.ppid()} {proc.status()} "
                        f"born={proc.create_time():.2f} {' '.join(proc.cmdline())[:120]}")
    return "\n".join(rows)


def test_a_scheduler_that_exits_is_started_again(server, rejected, sweep_run):
    """standalone never restarts a component: a scheduler that dies (as Airflow's does after
    a refused SQLite backfill, with ObjectDeletedError) leaves runs that never move. make
    airflow starts another; the Ctrl-C test below then runs on it, and finds no process
    left. What the killed one leaves (its executor workers, log server) is killed too, before
    the next one starts, or the log server keeps the port the next one's must bind. SIGKILL
    stands for the crash: the race itself cannot be provoked on demand, but may have struck
    during the tests above, so the one killed here may be a replacement already, and only
    what make airflow prints after the kill counts. (After it, the scheduler may also hang
    in its shutdown instead of exiting; tests/test_scheduler_watch.py covers that, with the
    heartbeat's age that scheduler_heartbeat_age reads here from the real api-server.)"""
    (old,) = _schedulers(server)
    # its executor workers, log server and task processes, however young
    left_behind = psutil.Process(old).children(recursive=True)
    assert left_behind
    printed = len(server.lines)
    killed = time.time()
    os.kill(old, signal.SIGKILL)
    server.wait_for_line(re.compile(r"Airflow's scheduler exited( \(exit -9\))?; starting it "
                                    r"again"), timeout=60, after=printed)
    # Ended before the line, whenever they were born: make airflow prints it, then starts
    # the next scheduler, once the watch has killed and reaped what the killed one left.
    alive = []
    for child in left_behind:
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child.pid)
    assert not alive, f"the killed scheduler's {alive} outlived it\n{_process_table(server)}"

    def heartbeat_after_kill():
        health = server.api("GET", "/monitor/health").json()["scheduler"]
        beat = health.get("latest_scheduler_heartbeat")
        return health["status"] == "healthy" and beat and \
            datetime.fromisoformat(beat.replace("Z", "+00:00")).timestamp() > killed
    server.wait_for("the new scheduler's heartbeat", heartbeat_after_kill, timeout=120)
    assert scheduler_heartbeat_age(server.base) < 30
    schedulers = _schedulers(server)
    new = [pid for pid, born in schedulers.items() if pid != old and born > killed]
    assert len(new) == 1 and old not in schedulers, \
        f"killed {old} at {killed:.2f}; schedulers {schedulers}\n{_process_table(server)}"


# --- last: Ctrl-C ---------------------------------------------------------------------------

def test_ctrl_c_stops_airflow_and_the_running_tasks(server, finished_run):
    """A second run, stopped mid-way: validate and prepare_data done and a worker step started
    (task processes and TensorFlow workers to stop), then Ctrl-C."""
    run_id = quote(trigger(server, DAG_ID, TINY)["dag_run_id"], safe="")

    def worker_step_started():
        tis = {ti["task_id"]: ti["state"] for ti in server.api(
            "GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances").json()["task_instances"]}
        assert "failed" not in tis.values(), tis
        return tis.get("validate") == "success" and tis.get("prepare_data") == "success" \
            and tis.get("tokenize") in ("running", "success")

    server.wait_for("the second run's tokenize step", worker_step_started, timeout=300,
                    interval=2)
    before = server._our_pids()
    assert len(before) >= 4, before  # standalone and its components (+ task processes)

    stopping = time.monotonic()
    rc = server.interrupt()
    print(f"\nstopped {time.monotonic() - stopping:.0f}s after Ctrl-C (make exit {rc})")
    assert "Stopped; no Airflow process left." in server.output, server.output
    assert server._our_pids() == []
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{server.base}/api/v2/monitor/health", timeout=5)
