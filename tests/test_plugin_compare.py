"""The bertflow page's compare view (`/bertflow/compare?run=dag_id/run_key&run=...`), served by
Airflow's real api-server app (in process, with a JWT): over the synthetic tree of
tests/plugin_helpers.py, and over run folders written by the pipeline's own code
(runlayout.init_run's config.json, the evaluate step's classification_metrics)."""
from __future__ import annotations

import html
import json
import re

import pytest

from plugin_helpers import DAG_ID, RUNS, api_server, build_artifacts, logged_in  # noqa: F401
from storage_servers import connections, gcs_emulator, root, s3_server  # noqa: F401
from tasks.config import parse_config
from tasks.io.uris import join_uri
from tasks.io import storage
from tasks.runs import compare, runlayout
from tasks.runs.runlayout import RunContext

FIRST, SECOND, MANUAL = list(RUNS)  # baseline day 1, baseline day 2, long-seq


@pytest.fixture
def tree(artifact_root):
    build_artifacts(artifact_root)
    return artifact_root


def _url(*run_keys: str) -> str:
    return "/bertflow/compare?" + "&".join(f"run={DAG_ID}/{k}" for k in run_keys)


def _fields(page: str, kind: str, row_class: str) -> list[str]:
    """data-field of the differing ('differs') or folded equal ('equal') rows of a section."""
    if row_class == "differs":
        m = re.search(rf"<table class='differs {kind}'>(.*?)</table>", page, flags=re.S)
    else:
        m = re.search(rf"<details class='equal {kind}'>(.*?)</details>", page, flags=re.S)
    return re.findall(rf"<tr class='{row_class}' data-field='([^']+)'", m[1]) if m else []


def test_only_differing_config_fields_and_metrics_are_tabled(logged_in, tree):
    page = logged_in.get(_url(FIRST, SECOND))
    assert page.status_code == 200, page.text
    text = page.text
    # plugin_helpers' two baseline runs differ in learning rate and epochs only.
    assert _fields(text, "config", "differs") == ["epochs", "learning_rate"]
    assert _fields(text, "config", "equal") == ["experiment", "max_seq_length",
                                                "per_replica_batch_size", "provisioner",
                                                "strategy"]
    assert "all 5 other config fields equal" in text
    row = re.search(r"<tr class='differs' data-field='learning_rate'>.*?</tr>", text)[0]
    assert re.findall(r"<td>([^<]*)</td>", row) == ["5e-05", "3e-05"]  # in the runs' order
    assert _fields(text, "metrics", "differs") == ["accuracy", "macro_f1"]
    assert "<details class='equal metrics'>" not in text  # nothing equal to fold
    # Three runs: the long-seq run differs in batch, sequence length, strategy, provisioner
    # and experiment too; nothing is equal any more.
    three = logged_in.get(_url(FIRST, SECOND, MANUAL)).text
    assert _fields(three, "config", "differs") == [
        "epochs", "experiment", "learning_rate", "max_seq_length", "per_replica_batch_size",
        "provisioner", "strategy"]
    assert "No config field" not in three and "<details class='equal config'>" not in three


def test_curves_overlay_one_series_per_run_in_distinct_colours(logged_in, tree):
    text = logged_in.get(_url(FIRST, SECOND, MANUAL)).text
    charts = re.findall(r"<svg class='chart' data-series='(\w+)'.*?</svg>", text, flags=re.S)
    assert charts == ["loss", "accuracy", "learning_rate"]
    refs = [f"{DAG_ID}/{k}" for k in (FIRST, SECOND, MANUAL)]
    for series in charts:
        svg = re.search(rf"<svg class='chart' data-series='{series}'.*?</svg>", text,
                        flags=re.S)[0]
        lines = re.findall(rf"<polyline class='{series}' points='([^']+)' data-run='([^']+)' "
                           r"fill='none' stroke='([^']+)'", svg)
        assert [run for _, run, _ in lines] == refs
        assert len({colour for _, _, colour in lines}) == 3
        # One vertex per history record of each run (36, 48 and 20 steps).
        assert [len(points.split()) for points, _, _ in lines] == \
            [RUNS[k][4]["steps"] for k in (FIRST, SECOND, MANUAL)]
        # Shared x axis: the longest run (48 steps) spans the plot, the 20-step one less.
        ends = [float(points.split()[-1].split(",")[0]) for points, _, _ in lines]
        assert ends[1] == max(ends) and ends[2] < ends[0] < ends[1]
    legend = re.search(r"<table class='runs'>.*?</table>", text, flags=re.S)[0]
    assert re.findall(r"data-run='([^']+)'", legend) == refs
    # The charts' legend: each run by the colour its curves are drawn in.
    key = re.search(r"<p class='legend'>(.*?)</p>", text, flags=re.S)[1]
    assert re.findall(r"<span data-run='([^']+)'><span class='swatch' style='[^']*"
                      r"background:([^']+)'>", key) == [(run, colour) for _, run, colour in lines]


def _real_run(root: str, run_key: str, labels: list[str], matrix: list[list[int]],
              **config) -> dict:
    """A run folder as the pipeline leaves it: config.json and context.json by
    runlayout.init_run, evaluate/metrics.json from the evaluate step's own
    classification_metrics and its manifest's metrics. Returns the metrics."""
    from tasks.steps.evaluate import classification_metrics

    cfg = parse_config({"artifact_root": root, "experiment": "real", **config})
    ctx = RunContext(artifact_root=root, dag_id=DAG_ID, run_key=run_key, run_id=run_key,
                     experiment="real")
    runlayout.init_run(cfg, ctx)
    metrics = classification_metrics(matrix, labels)
    metrics_uri = join_uri(ctx.step_uri("evaluate"), "metrics.json")
    storage.write_json(metrics_uri, metrics)
    runlayout.write_manifest(ctx.step_uri("evaluate"), {
        "metrics_uri": metrics_uri, "num_examples": metrics["num_examples"],
        "metrics": {"accuracy": metrics["accuracy"], "macro_f1": metrics["macro_f1"]}})
    return metrics


def _matrix_table(page: str, ref: str) -> tuple[list[str], list[str], list[list[str]]]:
    """(column labels, row labels, cells) of a run's confusion-matrix table, unescaped."""
    table = re.search(rf"<table class='confusion-table' data-run='{re.escape(ref)}'>(.*?)"
                      r"</table>", page, flags=re.S)[1]
    rows = re.findall(r"<tr>(.*?)</tr>", table, flags=re.S)
    columns = [html.unescape(c) for c in re.findall(r"<th>([^<]*)</th>", rows[0])]
    labels = [html.unescape(re.search(r"<th class='l'>([^<]*)</th>", r)[1]) for r in rows[1:]]
    cells = [re.findall(r"<td>([^<]*)</td>", r) for r in rows[1:]]
    return columns, labels, cells


def test_real_run_folders_of_different_label_sets(logged_in, artifact_root):
    """Full RunConfig config.json files differing in one field; confusion matrices of two
    label sets, each drawn with its own labels, as their metrics files hold them."""
    two = _real_run(artifact_root, "real-a", ["neg", "pos"], [[8, 2], [1, 9]],
                    learning_rate=3e-5)
    three = _real_run(artifact_root, "real-b", ["a<", "b", "c"],
                      [[5, 1, 0], [0, 6, 1], [2, 0, 7]], learning_rate=3.00001e-5)
    page = logged_in.get(_url("real-a", "real-b"))
    assert page.status_code == 200, page.text
    text = page.text
    assert _fields(text, "config", "differs") == ["learning_rate"]
    row = re.search(r"<tr class='differs' data-field='learning_rate'>.*?</tr>", text)[0]
    assert re.findall(r"<td>([^<]*)</td>", row) == ["3e-05", "3.00001e-05"]  # exact values
    config = compare.flatten(json.loads(storage.read_text(
        join_uri(artifact_root, "runs", DAG_ID, "real-a", "config.json"))))
    assert len(config) > 20  # the whole RunConfig, not a handful of fields
    assert f"all {len(config) - 1} other config fields equal" in text
    assert len(_fields(text, "config", "equal")) == len(config) - 1
    for run_key, metrics in (("real-a", two), ("real-b", three)):
        columns, labels, cells = _matrix_table(text, f"{DAG_ID}/{run_key}")
        assert columns == labels == metrics["labels"]
        assert [[int(c) for c in row] for row in cells] == metrics["confusion_matrix"]
    assert "<th>a&lt;</th>" in text and "<th>a<</th>" not in text  # escaped, never markup


def test_compare_reads_gs_and_s3_artifact_roots(logged_in, root, monkeypatch):
    """The same tree in a bucket (GCS emulator / moto S3 on loopback, tests/storage_servers.py),
    read through tasks.io.storage."""
    build_artifacts(root)
    monkeypatch.setenv("BERTFLOW_ARTIFACT_ROOT", root)
    page = logged_in.get(_url(FIRST, MANUAL))
    assert page.status_code == 200, page.text
    assert "learning_rate" in _fields(page.text, "config", "differs")
    assert page.text.count("<table class='confusion-table'") == 2
    assert logged_in.get(_url(FIRST, "absent")).status_code == 404


def test_a_field_one_run_lacks_differs_from_a_recorded_null(logged_in, tree):
    """An older config.json without a field, against one recording it as null: differing,
    shown as absent and as '–'."""
    for run_key, extra in ((FIRST, {"eval_uri": None}), (SECOND, {})):
        uri = join_uri(tree, "runs", DAG_ID, run_key, "config.json")
        storage.write_json(uri, {**storage.read_json(uri), "learning_rate": 1e-5, "epochs": 3,
                                 **extra})
    text = logged_in.get(_url(FIRST, SECOND)).text
    assert _fields(text, "config", "differs") == ["eval_uri"]
    row = re.search(r"<tr class='differs' data-field='eval_uri'>.*?</tr>", text)[0]
    assert re.findall(r"<td>(.*?)</td>", row) == ["–", "<i class='absent'>absent</i>"]
    assert compare.split_fields([{"n": 1}, {"n": 1.0}, {"n": True}])[0] == \
        [("n", [1, 1.0, True])]


def test_anonymous_requests_are_refused(api_server, tree):
    client, _ = api_server
    assert client.get(_url(FIRST, SECOND)).status_code == 401
    assert client.get(_url(FIRST, SECOND),
                      headers={"Authorization": "Bearer x.y.z"}).status_code == 403


def test_errors_name_what_is_wrong(logged_in, tree):
    one = logged_in.get(_url(FIRST))
    assert one.status_code == 400 and "at least 2 runs" in one.json()["detail"]
    assert logged_in.get("/bertflow/compare").status_code == 400
    same = logged_in.get(_url(FIRST, FIRST))  # one run twice is one run
    assert same.status_code == 400 and "(got 1)" in same.json()["detail"]
    missing = logged_in.get(_url(FIRST, "nope__2020-01-01"))
    assert missing.status_code == 404
    assert missing.json()["detail"] == f"no such run folder: {DAG_ID}/nope__2020-01-01"
    for bad in ("..%2F..", f"{DAG_ID}", f"{DAG_ID}/a/b", f"{DAG_ID}/.."):
        response = logged_in.get(f"/bertflow/compare?run={DAG_ID}/{FIRST}&run={bad}")
        assert response.status_code == 400 and "dag_id/run_key" in response.json()["detail"]


def test_index_checkboxes_and_run_page_links_lead_to_the_compare_page(logged_in, tree):
    index = logged_in.get("/bertflow/").text
    assert "<form id='compare' action='compare' method='get'>" in index
    boxes = re.findall(r"<input type='checkbox' form='compare' name='run' value='([^']+)'>",
                       index)
    assert sorted(boxes) == sorted(f"{DAG_ID}/{k}" for k in RUNS)
    # What the form submits for two ticked boxes.
    picked = logged_in.get("/bertflow/compare", params={"run": boxes[:2]})
    assert picked.status_code == 200 and "Comparing 2 runs" in picked.text
    run_page = logged_in.get(f"/bertflow/runs/{DAG_ID}/{FIRST}").text
    links = re.findall(r"<a class='compare' href='\.\./\.\./(compare\?[^']+)'>([^<]+)</a>",
                       run_page)
    # The other run of experiment "baseline" only (long-seq is another experiment).
    assert links == [(f"compare?run={DAG_ID}%2F{FIRST}&amp;run={DAG_ID}%2F{SECOND}",
                      RUNS[SECOND][1])]
    followed = logged_in.get("/bertflow/" + html.unescape(links[0][0]))
    assert followed.status_code == 200 and "Comparing 2 runs" in followed.text
    assert "href='../../#compare'>pick runs on the index</a>" in run_page


def test_a_sweep_s_page_lists_its_trials_and_compares_them_all(logged_in, artifact_root):
    """A sweep folder written by tasks/runs/sweep.py: its page tables every trial (the chosen
    one starred, links to each trial's page) and links all of them side by side."""
    from tasks.runs import sweep

    plan = sweep.plan({"max_steps": 3}, {"grid": {"learning_rate": [3e-5, 5e-5, 1e-4]}})
    ctx = RunContext(artifact_root, "bert_sweep", "exp__2026-10-01", "backfill__x", "exp")
    out = sweep.init_sweep(plan, ctx, max_parallel_trials=2)
    for trial, accuracy in zip(out["trials"][:2], (0.75, 0.875)):  # trial 3 failed
        runlayout.write_manifest(join_uri(trial["run_uri"], "train"), {"steps": 3, "validation": {
            "metric": "accuracy", "exported_value": accuracy, "best_step": 3,
            "stopped_early": False, "pruned": None}})
    sweep.pick_best(ctx.run_uri)
    page = logged_in.get("/bertflow/runs/bert_sweep/exp__2026-10-01")
    assert page.status_code == 200, page.text
    rows = re.findall(r"<tr class='trial'><td class='l'>(&#9733; )?<a href='([^']+)'>([^<]+)"
                      r"</a></td><td class='validation'>([^<]+)</td>", page.text)
    assert rows == [("", "exp__2026-10-01__trial-01", "learning_rate=3e-05", "0.75"),
                    ("&#9733; ", "exp__2026-10-01__trial-02", "learning_rate=5e-05", "0.875"),
                    ("", "exp__2026-10-01__trial-03", "learning_rate=0.0001", "–")]
    trial_page = logged_in.get("/bertflow/runs/bert_sweep/" + rows[1][1])
    assert trial_page.status_code == 200 and "<h3>Sweep</h3>" not in trial_page.text
    link = re.search(r"<a class='compare' href='\.\./\.\./(compare\?[^']+)'>compare all 3 "
                     r"trials</a>", page.text)
    compared = logged_in.get("/bertflow/" + html.unescape(link[1]))
    assert compared.status_code == 200 and "Comparing 3 runs" in compared.text
    assert _fields(compared.text, "config", "differs") == ["learning_rate"]
