"""The bertflow page's content, served by Airflow's real api-server app (in process, with a
JWT) over a synthetic artifact tree (tests/plugin_helpers.py), and the "bertflow run" extra
link of the DAG's worker steps."""
from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from plugin_helpers import (CHAMPION_RUN, DAG_ID, ELSEWHERE_RUNS, LABELS, MODEL,  # noqa: F401
                            RUNS, api_server, build_artifacts, build_export_elsewhere,
                            logged_in)
from storage_servers import connections, gcs_emulator, root, s3_server  # noqa: F401

RUN_KEY = "baseline__2024-01-01T00_00_00_00_00"
# A row of a models table: (champion class, version, accuracy).
VERSION_ROW = (r"<tr class='(champion)?'>\s*<td class='l'>(?:&#9733; )?(v[^<]+)</td>\s*"
               r"<td>([^<]+)</td>")


@pytest.fixture
def tree(artifact_root):
    build_artifacts(artifact_root)
    return artifact_root


def _rows(page: str) -> list[str]:
    """The experiments table's rows, group headings included, in page order."""
    table = page.split("<table class='experiments'>", 1)[1].split("</table>", 1)[0]
    return re.findall(r"<tr class='(?:group|run)'.*?</tr>", table, flags=re.S)


def test_index_groups_runs_by_experiment_with_their_figures(logged_in, tree):
    page = logged_in.get("/bertflow/")
    assert page.status_code == 200, page.text
    rows = _rows(page.text)
    # Groups sorted by name, newest run first in a group.
    assert [r.split("data-experiment='", 1)[1].split("'", 1)[0] for r in rows] == \
        ["baseline"] * 3 + ["long-seq"] * 2
    assert "experiment baseline (2 runs)" in rows[0] and "experiment long-seq (1 run)" in rows[3]
    newest, oldest, manual = rows[1], rows[2], rows[4]
    assert "2024-01-02T00:00:00+00:00" in newest and "2024-01-01T00:00:00+00:00" in oldest
    assert f"href='runs/{DAG_ID}/{RUN_KEY}'" in oldest
    cells = re.findall(r"<td[^>]*>(.*?)</td>", oldest)
    # date, lr, epochs, batch, max_seq_length, strategy, provisioner, accuracy, macro-F1,
    # train time, examples/s, version
    assert cells[1:11] == ["5e-05", "3", "32 / 32", "128", "one_device", "local", "0.8123",
                           "0.7011", "2.1 min", "51.25"]
    manual_cells = re.findall(r"<td[^>]*>(.*?)</td>", manual)
    assert "manual__2024-02-01T10:00:00+00:00" in manual_cells[0]  # no logical date: run id
    assert manual_cells[3:11] == ["64 / 16", "256", "multi_worker_mirrored", "kubernetes",
                                  "0.9012", "0.8876", "15.0 min", "210.75"]
    # The champion's version is starred, the others are not.
    assert "&#9733;" in manual_cells[11] and "&#9733;" not in cells[11]


def test_index_lists_model_versions_with_the_champion_marked(logged_in, tree):
    page = logged_in.get("/bertflow/").text
    models = page.split("<h3>Models</h3>", 1)[1].split("<h3>Experiments</h3>", 1)[0]
    champion = RUNS[CHAMPION_RUN][-1]
    versions = re.findall(VERSION_ROW, models)
    assert versions == [("champion", champion, "0.9012"),
                        ("", "v20240102T000500-bbbbbbbb", "0.8456"),
                        ("", "v20240101T000500-aaaaaaaa", "0.8123")]  # not the partial one
    assert f"champion: <span class='champion'>&#9733; {champion}</span>" in models
    assert f"href='models/{MODEL}/{champion}/card'" in models
    card = logged_in.get(f"/bertflow/models/{MODEL}/{champion}/card")
    assert card.status_code == 200 and card.text == f"# {MODEL} {champion}\n"


def test_experiments_table_sorts_within_groups(logged_in, tree):
    page = logged_in.get("/bertflow/?sort=accuracy&order=asc").text
    accuracies = [re.search(r"<td class='accuracy'>([^<]+)", r)[1]
                  for r in _rows(page) if "class='run'" in r]
    assert accuracies == ["0.8123", "0.8456", "0.9012"]
    assert "&#9650;" in page  # the sorted column is marked
    assert logged_in.get("/bertflow/?sort=__class__").status_code == 400


def test_run_page_draws_curves_and_confusion_matrix_as_svg(logged_in, tree):
    page = logged_in.get(f"/bertflow/runs/{DAG_ID}/{RUN_KEY}")
    assert page.status_code == 200, page.text
    text = page.text
    charts = re.findall(r"<svg class='chart' data-series='(\w+)'.*?</svg>", text, flags=re.S)
    assert charts == ["loss", "accuracy", "learning_rate"]
    for series in charts:
        points = re.search(rf"<polyline class='{series}' points='([^']+)'", text)[1].split()
        assert len(points) == RUNS[RUN_KEY][4]["steps"]  # one vertex per history record
        xs = [float(p.split(",")[0]) for p in points]
        assert xs == sorted(xs) and xs[-1] - xs[0] > 300  # spans the plot width
    loss_ys = [float(p.split(",")[1]) for p in
               re.search(r"<polyline class='loss' points='([^']+)'", text)[1].split()]
    assert loss_ys[-1] > loss_ys[0]  # loss falls: lower on screen = larger y
    matrix = re.search(r"<svg class='confusion'.*?</svg>", text, flags=re.S)[0]
    assert matrix.count("<rect class='cell'") == 9
    for label in LABELS:
        assert f"<title>{label.replace('<', '&lt;').replace('>', '&gt;')}</title>" in matrix
    assert "<b>ug" not in text  # stored text is escaped, never markup
    assert ">40</text>" in matrix and ">17</text>" in matrix
    tb_dir = f"{tree}/runs/{DAG_ID}/{RUN_KEY}/train/tensorboard"
    assert f"<code class='tensorboard'>tensorboard --logdir {tb_dir}</code>" in text
    assert "href='../../models/bert-classifier/v20240101T000500-aaaaaaaa/card'" in text


def test_run_page_draws_the_validation_curve_with_its_best_step(logged_in, tree):
    import json
    from pathlib import Path

    history_file = Path(tree) / "runs" / DAG_ID / RUN_KEY / "train" / "history.json"
    history = json.loads(history_file.read_text())
    history["validation"] = [{"step": s, "epoch": s / 10, "accuracy": a, "seconds": 0.1}
                             for s, a in ((2, 0.5), (4, 0.8), (6, 0.75))]
    history["best"] = {"metric": "accuracy", "best_step": 4, "best_value": 0.8,
                       "exported": "best", "stopped_early": True}
    history_file.write_text(json.dumps(history))
    text = logged_in.get(f"/bertflow/runs/{DAG_ID}/{RUN_KEY}").text
    chart = re.search(r"<svg class='chart' data-series='validation'.*?</svg>", text,
                      flags=re.S)[0]
    assert ">validation accuracy</text>" in chart
    xs = [float(p.split(",")[0]) for p in
          re.search(r"<polyline class='validation' points='([^']+)'", chart)[1].split()]
    mark = re.search(r"<line class='mark' x1='([\d.]+)'.*?<title>([^<]+)</title>", chart)
    assert float(mark[1]) == xs[1]  # the mark stands on step 4, the best
    assert mark[2] == "best: step 4, accuracy 0.8 (exported)"


def test_run_page_tables_both_models_on_the_same_rows(logged_in, tree):
    import numpy as np

    from tasks.gate import unit_scores
    from tasks.io import storage
    from tasks.steps import gate_eval

    truth = np.array([0] * 60 + [1] * 30 + [2] * 10)
    champ, cand = truth.copy(), truth.copy()
    champ[60:75] = 0  # the champion misses 15 of class 1, the candidate 5 of class 2
    cand[90:95] = 0
    scored = {side: unit_scores.classification(truth, p, ["x", "y", "z"])
              for side, p in (("candidate", cand), ("champion", champ))}
    run = f"{tree}/runs/{DAG_ID}/{RUN_KEY}"
    storage.write_json(f"{run}/gate_eval/manifest.json", {
        "champion": {"version": "v0"}, "metric": "accuracy",
        **gate_eval.compared(scored, "classification", "accuracy", 0)})
    text = logged_in.get(f"/bertflow/runs/{DAG_ID}/{RUN_KEY}").text
    table = re.search(r"<table class='comparison'>.*?</table>", text, flags=re.S)[0]
    assert "champion v0 on the same 100 test rows" in table
    cells = re.findall(r"<tr class='metric'><td class='l'>accuracy</td><td>([^<]+)</td>"
                       r"<td>([^<]+)</td><td>([^<]+)</td>", table)
    assert cells[0][:2] == ("0.95", "0.85") and cells[0][2].startswith("+0.1000 [+")
    # The classes the candidate lowered most come first: z (5 of 10 missed).
    classes = re.findall(r"<tr class='class'><td class='l'>F1 (\w) \((\d+)\)</td>", table)
    assert classes[0] == ("z", "10") and len(classes) == 3


def test_run_page_of_a_run_still_training(logged_in, artifact_root):
    """A run folder without history or metrics yet still renders, saying what is missing."""
    from tasks.io import storage

    storage.write_json(f"{artifact_root}/runs/{DAG_ID}/fresh/context.json",
                       {"dag_id": DAG_ID, "run_key": "fresh", "run_id": "fresh"})
    page = logged_in.get(f"/bertflow/runs/{DAG_ID}/fresh")
    assert page.status_code == 200, page.text
    assert "No training history yet" in page.text and "Not evaluated yet" in page.text


def test_pages_read_gs_and_s3_artifact_roots(logged_in, root, monkeypatch):
    """The same tree in a bucket (GCS emulator / moto S3 on loopback), read through
    tasks.io.storage: the index, a run page and a model card."""
    build_artifacts(root)
    monkeypatch.setenv("BERTFLOW_ARTIFACT_ROOT", root)
    index = logged_in.get("/bertflow/")
    assert index.status_code == 200, index.text
    assert len([r for r in _rows(index.text) if "class='run'" in r]) == 3
    assert f"<code>{root}</code>" in index.text
    page = logged_in.get(f"/bertflow/runs/{DAG_ID}/{RUN_KEY}").text
    assert "<polyline class='learning_rate'" in page and "<svg class='confusion'" in page
    assert f"tensorboard --logdir {root}/runs/{DAG_ID}/{RUN_KEY}/train/tensorboard" in page
    champion = RUNS[CHAMPION_RUN][-1]
    assert logged_in.get(f"/bertflow/models/{MODEL}/{champion}/card").text.startswith("# ")


def test_damaged_files_do_not_break_the_pages(logged_in, tree):
    """Stored files are data, not trusted: a truncated history, a matrix of the wrong shape,
    a NaN loss or a JSON list where an object belongs are skipped, not a 500."""
    from tasks.io import storage

    run = f"{tree}/runs/{DAG_ID}/{RUN_KEY}"
    storage.write_text(f"{run}/train/history.json", '{"records": [{"step": 1, "loss": NaN}, '
                       '{"step": 2, "loss": 0.5, "accuracy": "x"}, 7]}')
    storage.write_json(f"{run}/evaluate/metrics.json", {"labels": LABELS,
                                                         "confusion_matrix": [[1, 2], [3]]})
    storage.write_json(f"{run}/config.json", [1, 2, 3])
    storage.write_text(f"{tree}/models/{MODEL}/CHAMPION.json", "{not json")
    page = logged_in.get(f"/bertflow/runs/{DAG_ID}/{RUN_KEY}")
    assert page.status_code == 200, page.text
    assert "<svg class='confusion'" not in page.text
    assert logged_in.get("/bertflow/").status_code == 200


def test_anonymous_requests_are_refused(api_server, tree):
    client, _ = api_server
    for path in ("/bertflow/", f"/bertflow/runs/{DAG_ID}/{RUN_KEY}",
                 f"/bertflow/models/{MODEL}/{RUNS[RUN_KEY][-1]}/card"):
        assert client.get(path).status_code == 401, path
        assert client.get(path, headers={"Authorization": "Bearer x.y.z"}).status_code == 403


@pytest.mark.parametrize("path", [
    "/bertflow/runs/../runs", "/bertflow/runs/%2e%2e/%2e%2e",
    f"/bertflow/runs/{DAG_ID}/..", f"/bertflow/runs/{DAG_ID}/%2e%2e",
    f"/bertflow/runs/{DAG_ID}/..%2F..%2Fmodels", f"/bertflow/runs/{DAG_ID}%2F{RUN_KEY}/train",
    f"/bertflow/runs/{DAG_ID}/..%5C..%5Cmodels", f"/bertflow/runs/{DAG_ID}/%5C{RUN_KEY}",
    f"/bertflow/runs/{DAG_ID}/{RUN_KEY}%00", f"/bertflow/runs/{DAG_ID}/.{RUN_KEY}",
    f"/bertflow/runs/%2Fetc/passwd", "/bertflow/runs/x/%252e%252e",
    f"/bertflow/runs/{DAG_ID}/{RUN_KEY}%2Ftrain", f"/bertflow/runs/{DAG_ID}/nope",
    f"/bertflow/runs/other_dag/{RUN_KEY}",
    f"/bertflow/models/..%2F..%2Fruns/{MODEL}/card", f"/bertflow/models/%2e%2e/v1/card",
    f"/bertflow/models/{MODEL}/..%5Cv1/card", f"/bertflow/models/{MODEL}/v20240301T000000-"
    "dddddddd/card",  # not completely published
    f"/bertflow/models/{MODEL}/CHAMPION.json/card",
    f"/bertflow/models/{MODEL}/{RUNS[CHAMPION_RUN][-1]}/card?location=..",
    f"/bertflow/models/{MODEL}/{RUNS[CHAMPION_RUN][-1]}/card?location=%2e%2e%2f",
    f"/bertflow/models/{MODEL}/{RUNS[CHAMPION_RUN][-1]}/card?location=%2Fetc",
])
def test_traversal_and_unlisted_names_are_refused(logged_in, tree, path):
    resp = logged_in.get(path)
    assert resp.status_code in (400, 404), (path, resp.status_code, resp.text[:200])


def test_run_page_links_the_worker_logs_and_serves_them(logged_in, api_server, tree):
    """Logs kept in the run folder (tasks/provision/worker_logs.py) are linked from the run
    page and served as text, to logged-in users only; nothing else under the run is."""
    from tasks.io import storage

    run = f"{tree}/runs/{DAG_ID}/{RUN_KEY}"
    storage.write_text(f"{run}/train/logs/chief-0.log", "step 1 <loss> 0.7\n")
    storage.write_text(f"{run}/train/logs/worker-1.log", "worker 1 up\n")
    storage.write_text(f"{run}/tokenize/logs/worker-0.log", "tokenized 120 rows\n")
    storage.write_text(f"{run}/train/logs/notes.txt", "not a log")
    page = logged_in.get(f"/bertflow/runs/{DAG_ID}/{RUN_KEY}").text
    hrefs = re.findall(r"<a class='log' href='([^']+)'", page)
    assert hrefs == [f"{RUN_KEY}/logs/tokenize/worker-0.log",
                     f"{RUN_KEY}/logs/train/chief-0.log", f"{RUN_KEY}/logs/train/worker-1.log"]
    served = logged_in.get(f"/bertflow/runs/{DAG_ID}/{hrefs[1]}")
    assert served.status_code == 200 and served.text == "step 1 <loss> 0.7\n"
    assert served.headers["content-type"].startswith("text/plain")
    for path, codes in ((f"{RUN_KEY}/logs/train/notes.txt", {400}),
                        (f"{RUN_KEY}/logs/train/worker-2.log", {404}),
                        (f"{RUN_KEY}/logs/manifest/worker-0.log", {400}),
                        (f"{RUN_KEY}/logs/train/..%2Fmanifest.json", {400, 404}),
                        ("nope/logs/train/chief-0.log", {404})):
        assert logged_in.get(f"/bertflow/runs/{DAG_ID}/{path}").status_code in codes, path
    client, _ = api_server
    client.cookies.clear()
    assert client.get(f"/bertflow/runs/{DAG_ID}/{hrefs[1]}").status_code == 401


def test_run_page_links_every_attempts_worker_logs(logged_in, api_server, tree):
    """Each provisioning attempt keeps its own log files ({role}-{index}.attempt-{n}.log);
    the run page lists them grouped by attempt, with the attempt's outcome, and serves each
    (the plain newest-attempt copy is not listed twice)."""
    from tasks.io import storage

    run = f"{tree}/runs/{DAG_ID}/{RUN_KEY}"
    for n, text in ((1, "attempt one, preempted at step 40"), (2, "attempt two, done")):
        for worker in ("worker-0", "worker-1"):
            storage.write_text(f"{run}/train/logs/{worker}.attempt-{n}.log",
                               f"{worker}: {text}\n")
    for worker in ("worker-0", "worker-1"):
        storage.write_text(f"{run}/train/logs/{worker}.log", f"{worker}: attempt two, done\n")
    storage.write_json(f"{run}/train/attempts.json", [
        {"attempt": 1, "outcome": "preempted"}, {"attempt": 2, "outcome": "success"}])
    storage.write_text(f"{run}/evaluate/logs/chief-0.log", "evaluated\n")  # no attempt file
    page = logged_in.get(f"/bertflow/runs/{DAG_ID}/{RUN_KEY}").text
    logs = page.split("<h3>Worker logs</h3>", 1)[1]
    attempts = re.findall(r"<li class='log-attempt' data-attempt='(\d*)'>([^:<]*):(.*?)</li>",
                          logs, flags=re.S)
    assert [(n, label.strip()) for n, label, _ in attempts] == [
        ("1", "attempt 1 (preempted)"), ("2", "attempt 2 (success)"), ("", "latest")]
    links = [re.findall(r"<a class='log' href='([^']+)'>([^<]+)</a>", body)
             for _, _, body in attempts]
    assert links == [
        [(f"{RUN_KEY}/logs/train/worker-0.attempt-1.log", "worker-0"),
         (f"{RUN_KEY}/logs/train/worker-1.attempt-1.log", "worker-1")],
        [(f"{RUN_KEY}/logs/train/worker-0.attempt-2.log", "worker-0"),
         (f"{RUN_KEY}/logs/train/worker-1.attempt-2.log", "worker-1")],
        [(f"{RUN_KEY}/logs/evaluate/chief-0.log", "chief-0")]]
    served = logged_in.get(f"/bertflow/runs/{DAG_ID}/{links[0][1][0]}")
    assert served.status_code == 200 and served.text == \
        "worker-1: attempt one, preempted at step 40\n"
    for path, codes in ((f"{RUN_KEY}/logs/train/worker-0.attempt-3.log", {404}),
                        (f"{RUN_KEY}/logs/train/worker-0.attempt-1.log.bak", {400}),
                        (f"{RUN_KEY}/logs/train/worker-0.attempt-..%2F1.log", {400, 404}),
                        (f"{RUN_KEY}/logs/train/..%2F..%2Fconfig.json", {400, 404})):
        assert logged_in.get(f"/bertflow/runs/{DAG_ID}/{path}").status_code in codes, path
    client, _ = api_server
    client.cookies.clear()
    assert client.get(f"/bertflow/runs/{DAG_ID}/{links[0][0][0]}").status_code == 401


# --- models exported outside {artifact_root}/models ---------------------------------------------

@pytest.fixture
def elsewhere(tree, tmp_path):
    """The tree plus runs exporting to local folders outside the artifact root; returns
    run_key -> resolved export location."""
    return build_export_elsewhere(tree, str(tmp_path / "other-bucket"), tmp_path / "scratch")


def _models_section(page: str) -> str:
    return page.split("<h3>Models</h3>", 1)[1].split("<h3>Experiments</h3>", 1)[0]


def _location_table(models: str, location: str) -> str:
    from tasks.runs.run_summary import location_id

    return models.split(f"data-location='{location_id(location)}'>", 1)[1].split("</table>")[0]


def test_models_exported_elsewhere_are_listed_with_their_champion_and_card(
        logged_in, tree, elsewhere, tmp_path):
    from tasks.runs.run_summary import location_id

    shared = elsewhere["offsite__2024-03-01T00_00_00_00_00"]
    daily = elsewhere["offsite__2024-03-03T00_00_00_00_00"]
    assert shared == str(tmp_path / "other-bucket" / "shared")
    assert daily == str(tmp_path / "other-bucket" / "daily" / "2024-03-03")  # {ds} resolved
    assert elsewhere["offsite__2024-03-02T00_00_00_00_00"] == shared  # trailing / recorded
    page = logged_in.get("/bertflow/")
    assert page.status_code == 200, page.text
    models = _models_section(page.text)
    # The default location first (unchanged: its own champion), then the others, each once.
    headings = re.findall(r"<h4>(.*?)</h4>", models)
    assert headings == [MODEL, f"{MODEL} <small>in <code>{daily}</code></small>",
                        f"{MODEL} <small>in <code>{shared}</code></small>"], headings
    default_rows = _location_table(models, f"{tree}/models")
    assert f"&#9733; {RUNS[CHAMPION_RUN][-1]}" in default_rows
    version = VERSION_ROW
    first, second, dated = (ELSEWHERE_RUNS[k][-1] for k in ELSEWHERE_RUNS)
    shared_rows = _location_table(models, shared)
    # The champion of {shared}/bert-classifier/CHAMPION.json (tasks.steps.promote), not the
    # default location's: the second run regressed and was not promoted.
    assert re.findall(version, shared_rows) == [("", second, "0.8"), ("champion", first, "0.85")]
    assert re.findall(version, _location_table(models, daily)) == [("champion", dated, "0.7")]
    assert f"champion: <span class='champion'>&#9733; {first}</span>" in models
    for location, name in ((shared, first), (shared, second), (daily, dated)):
        href = f"models/{MODEL}/{name}/card?location={location_id(location)}"
        assert f"href='{href}'" in models, href
        assert f"<code>{location}/{MODEL}/{name}</code>" in models
        card = logged_in.get(f"/bertflow/{href}")
        assert card.status_code == 200, card.text
        assert card.text == f"# {MODEL} {name} (offsite)\n"
        # Without its location (or with another one's) the version is not found there.
        assert logged_in.get(f"/bertflow/models/{MODEL}/{name}/card").status_code == 404
        other = location_id(f"{tree}/models")
        assert logged_in.get(f"/bertflow/models/{MODEL}/{name}/card?location={other}"
                             ).status_code == 404
    # The experiments table links each run's version at its own location, starred when it
    # is that location's champion.
    rows = [r for r in _rows(page.text) if "data-experiment='offsite'" in r
            and "class='run'" in r]
    assert len(rows) == 3
    cells = {re.search(r"data-run='([^']+)'", r)[1]: re.findall(r"<td[^>]*>(.*?)</td>", r)[-1]
             for r in rows}
    key = "offsite__2024-03-01T00_00_00_00_00"
    assert cells[key] == (f"&#9733; <a href='models/{MODEL}/{first}/card?location="
                          f"{location_id(shared)}'>{first}</a>")
    assert "&#9733;" not in cells["offsite__2024-03-02T00_00_00_00_00"]
    assert "&#9733;" in cells["offsite__2024-03-03T00_00_00_00_00"]
    # The run page links the card at the run's location and says where it went.
    run = logged_in.get(f"/bertflow/runs/{DAG_ID}/{key}").text
    assert (f"href='../../models/{MODEL}/{first}/card?location={location_id(shared)}'"
            in run), run
    assert f"in <code>{shared}</code>; promoted" in run


def test_unusable_recorded_export_uris_are_skipped(logged_in, tree, tmp_path):
    """A config.json is data: an export_uri that is relative, of another scheme, with
    credentials or the filesystem root is never listed (nor walked), and the pages still
    render."""
    from tasks.runs import run_summary
    from tasks.io import storage

    for i, uri in enumerate(("relative/models", "ftp://host/models", "/",
                             "gs://user:secret@bucket/m", 7)):
        run = f"{tree}/runs/{DAG_ID}/odd{i}"
        storage.write_json(f"{run}/context.json", {"dag_id": DAG_ID, "run_key": f"odd{i}"})
        storage.write_json(f"{run}/config.json", {"export_uri": uri, "experiment": "odd"})
        storage.write_json(f"{run}/export/manifest.json", {"model_name": MODEL,
                                                           "version": "v1"})
    assert run_summary.export_locations(tree) == [f"{tree}/models"]
    page = logged_in.get("/bertflow/")
    assert page.status_code == 200, page.text
    odd = [r for r in _rows(page.text) if "data-experiment='odd'" in r and "class='run'" in r]
    assert len(odd) == 5 and not any("/card" in r for r in odd)
    assert logged_in.get(f"/bertflow/runs/{DAG_ID}/odd0").status_code == 200


@pytest.mark.parametrize("location", [
    "..", "%2e%2e", "..%2F..", "%2e%2e%2f%2e%2e%2fmodels", "%2Fetc%2Fpasswd", "/etc/passwd",
    "{shared}", "{shared_quoted}", "file://{shared}", "{id}%2F..", "{id}/..", "{id}%00",
    "{id}%20", "{ID}", "{id}0", "%252e%252e", "..%5C..", "",
    "0000000000000000",  # well formed, not a known location
    "{etc_id}",  # the hash of a path no run exported to
])
def test_location_is_only_a_known_id(logged_in, tree, elsewhere, location):
    """The card route takes an export location only as the id of one the server found in the
    runs' recorded config: a path, an encoded path or an unknown id is refused, never read."""
    from urllib.parse import quote

    from tasks.runs.run_summary import location_id

    shared = elsewhere["offsite__2024-03-01T00_00_00_00_00"]
    name = ELSEWHERE_RUNS["offsite__2024-03-01T00_00_00_00_00"][-1]
    ok = location_id(shared)
    location = location.format(shared=shared, shared_quoted=quote(shared, safe=""), id=ok,
                               ID=ok.upper(), etc_id=location_id("/etc"))
    resp = logged_in.get(f"/bertflow/models/{MODEL}/{name}/card?location={location}")
    assert resp.status_code in (400, 404), (location, resp.status_code, resp.text[:200])
    assert logged_in.get(f"/bertflow/models/{MODEL}/{name}/card?location={ok}"
                         ).status_code == 200


@pytest.mark.parametrize("path", [
    "/bertflow/models/..%2F..%2Fruns/{v}/card?location={id}",
    "/bertflow/models/%2e%2e/{v}/card?location={id}",
    "/bertflow/models/{model}/..%2F{v}/card?location={id}",
    "/bertflow/models/{model}/%2e%2e%2f%2e%2e%2fdaily/card?location={id}",
    "/bertflow/models/{model}/CHAMPION.json/card?location={id}",
    "/bertflow/models/{model}/{v}%2Fmodel_card.md/card?location={id}",
    "/bertflow/models/{model}/{v}/card/..%2F..?location={id}",
    "/bertflow/models/{model}/{default_v}/card?location={id}",  # in another location
])
def test_names_at_an_export_location_are_checked(logged_in, tree, elsewhere, path):
    from tasks.runs.run_summary import location_id

    shared = elsewhere["offsite__2024-03-01T00_00_00_00_00"]
    path = path.format(model=MODEL, v=ELSEWHERE_RUNS["offsite__2024-03-01T00_00_00_00_00"][-1],
                       id=location_id(shared), default_v=RUNS[CHAMPION_RUN][-1])
    resp = logged_in.get(path)
    assert resp.status_code in (400, 404), (path, resp.status_code, resp.text[:200])


# --- the extra link on the DAG's worker steps -------------------------------------------------

@pytest.fixture(scope="module")
def dag_module():
    """dags/bert_finetune.py, imported as the dag-processor and the worker import it."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "dags" / "bert_finetune.py"
    spec = importlib.util.spec_from_file_location("bert_finetune_for_links", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dag(dag_module):
    return dag_module.bert_finetune()


def test_train_evaluate_export_link_to_their_run_page(dag, monkeypatch, tree):
    """get_link as the task runner calls it when a task ends (ti_key: the task instance),
    with XCom.get_value faked (no task runner here) to return what each task returned: its
    manifest URI."""
    from airflow.sdk.execution_time.xcom import XCom

    run_uri = f"{tree}/runs/{DAG_ID}/{RUN_KEY}"
    returned = {}
    monkeypatch.setattr(XCom, "get_value", classmethod(
        lambda cls, *, ti_key, key: returned.get((ti_key.task_id, key))))
    for step in ("train", "evaluate", "export"):
        op = dag.get_task(step)
        [link] = [x for x in op.operator_extra_links if x.name == "bertflow run"]
        ti_key = SimpleNamespace(dag_id=DAG_ID, task_id=step, run_id="r", map_index=-1,
                                 try_number=1)
        returned[(step, "return_value")] = f"{run_uri}/{step}/manifest.json"
        assert link.get_link(op, ti_key=ti_key) == f"/bertflow/runs/{DAG_ID}/{RUN_KEY}", step
    # A task that failed before returning a manifest: its rendered run folder instead.
    op = dag.get_task("train")
    op.run_uri = f"gs://bucket/art/runs/{DAG_ID}/{CHAMPION_RUN}"
    ti_key = SimpleNamespace(dag_id=DAG_ID, task_id="train", run_id="failed", map_index=-1)
    returned.clear()
    assert link.get_link(op, ti_key=ti_key) == f"/bertflow/runs/{DAG_ID}/{CHAMPION_RUN}"
    # Not a run folder (a hand-made --run-dir): no link rather than a wrong one.
    op.run_uri = "/tmp/somewhere/else"
    assert link.get_link(op, ti_key=ti_key) == ""


def test_link_resolves_to_a_page_that_exists(logged_in, tree):
    from bertflow_airflow.worker_operator import run_page_path

    path = run_page_path(f"{tree}/runs/{DAG_ID}/{RUN_KEY}/evaluate/manifest.json")
    assert logged_in.get("/" + path).status_code == 200


def test_serialized_dag_carries_the_link_for_the_ui(dag):
    """The api-server never runs get_link: it reads the link names from the serialized DAG and
    the link from the XCom the worker stored under the link's key."""
    from airflow.serialization.serialized_objects import DagSerialization

    tasks = DagSerialization.to_dict(dag)["dag"]["tasks"]
    links = {t["__var"]["task_id"]: t["__var"].get("_operator_extra_links") for t in tasks}
    for step in ("train", "evaluate", "export"):
        assert links[step] == {"bertflow run": "_link_RunPageLink"}, links[step]


def test_multi_label_and_regression_runs_show_their_metrics(logged_in, tree):
    """A multi-label run's page lists its F1 scores and a row per label; a regression run's
    its correlations and the predicted-against-true chart; a history whose training metric
    is not accuracy (label_accuracy, mse) still draws."""
    from tasks.io import storage

    run = f"{tree}/runs/{DAG_ID}/{RUN_KEY}"
    storage.write_json(f"{run}/train/history.json", {"records": [
        {"step": 1, "loss": 0.7, "mse": 0.3, "learning_rate": 1e-3},
        {"step": 2, "loss": 0.5, "mse": 0.2, "learning_rate": 1e-3}]})
    storage.write_json(f"{run}/evaluate/metrics.json", {
        "task": "multi_label", "micro_f1": 0.8125, "macro_f1": 0.75, "subset_accuracy": 0.5,
        "threshold": 0.5, "num_examples": 4, "labels": ["sport", "news"],
        "per_label": {"sport": {"precision": 1.0, "recall": 0.5, "f1": 0.6667, "support": 2},
                      "news": {"precision": 0.5, "recall": 1.0, "f1": 0.6667, "support": 1}}})
    page = logged_in.get(f"/bertflow/runs/{DAG_ID}/{RUN_KEY}")
    assert page.status_code == 200, page.text
    assert "micro_f1 <b>0.8125</b>" in page.text and "<td class='l'>news</td>" in page.text
    assert "data-series='mse'" in page.text
    storage.write_json(f"{run}/evaluate/metrics.json", {
        "task": "regression", "pearson": 0.9, "spearman": 0.85, "mse": 0.125,
        "num_examples": 5, "labels": ["score"], "binned": {"edges": [0, 0.5, 1], "rows": [
            {"low": 0, "high": 0.5, "count": 3, "mean_true": 0.2, "mean_predicted": 0.3},
            {"low": 0.5, "high": 1, "count": 2, "mean_true": 0.8, "mean_predicted": 0.7}]}})
    page = logged_in.get(f"/bertflow/runs/{DAG_ID}/{RUN_KEY}")
    assert page.status_code == 200, page.text
    assert "pearson <b>0.9</b>" in page.text.replace("0.9000", "0.9")
    assert page.text.count("<circle class='bin'") == 2 and "per-class" not in page.text
    storage.write_json(f"{run}/evaluate/manifest.json", {
        "task": "regression", "metrics_uri": f"{run}/evaluate/metrics.json", "num_examples": 5,
        "metrics": {"pearson": 0.9, "spearman": 0.85, "mse": 0.125}})
    index = logged_in.get("/bertflow/").text
    assert "<td class='accuracy'><small>pearson</small> 0.9" in index


def test_entity_runs_show_a_row_per_entity_type(logged_in, tree):
    """A token classification run's page lists entity F1, precision and recall, how many
    sentences max_seq_length cut, and a row per entity type under that heading."""
    from tasks.io import storage

    run = f"{tree}/runs/{DAG_ID}/{RUN_KEY}"
    storage.write_json(f"{run}/evaluate/metrics.json", {
        "task": "token_classification", "f1": 0.625, "macro_f1": 0.5, "precision": 0.7,
        "recall": 0.5625, "num_examples": 9, "truncated_sentences": 1,
        "labels": ["O", "B-LOC", "I-LOC"],
        "per_type": {"LOC": {"precision": 0.7, "recall": 0.5625, "f1": 0.625, "support": 16,
                             "predicted": 13, "correct": 9}}})
    page = logged_in.get(f"/bertflow/runs/{DAG_ID}/{RUN_KEY}")
    assert page.status_code == 200, page.text
    assert "<p class='metrics'>f1 <b>0.625</b>" in page.text
    assert "recall <b>0.5625</b>" in page.text
    assert "truncated_sentences <b>1" in page.text
    assert "<th class='l'>entity type</th>" in page.text
    assert "<td class='l'>LOC</td>" in page.text


def test_index_lists_scoring_runs_apart_from_the_experiments(logged_in, tree):
    """bert_batch_score's runs (tasks/scoring/publish.py's summary, or only the plan of one
    not published) are listed with their version, rows, unreadable rows and throughput, and
    never as an experiment's run."""
    from tasks.io import storage
    from tasks.io.uris import join_uri

    runs = join_uri(tree, "runs", "bert_batch_score")
    for key, summary, plan in [
        ("manual__1", {"model_version": "v1", "rows": 1200, "error_rows": 3, "workers": 2,
                       "seconds": 4.0, "rows_per_second": 300.0, "output_uri": "/out/a",
                       "published_at": "2024-03-01T00:00:00+00:00"}, None),
        ("manual__2", None, {"model": {"version": "v2"}, "rows": 50, "output_uri": "/out/b"})]:
        storage.write_json(join_uri(runs, key, "context.json"), {
            "artifact_root": tree, "dag_id": "bert_batch_score", "run_key": key, "run_id": key,
            "experiment": "default", "logical_date": "", "run_dir": ""})
        if summary:
            storage.write_json(join_uri(runs, key, "score", "summary.json"), summary)
        else:
            storage.write_json(join_uri(runs, key, "score", "plan.json"), plan)
    page = logged_in.get("/bertflow/").text
    table = page.split("<table class='scoring'>", 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr class='scoring-run'.*?</tr>", table, flags=re.S)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S) for row in rows]
    assert cells[0][:7] == ["manual__1", "v1", "1200", "3", "2", "4.0 s", "300"]
    assert cells[1][0].startswith("manual__2") and "not published" in cells[1][0]
    assert cells[1][1:3] == ["v2", "50"]
    assert "bert_batch_score" not in page.split("<table class='experiments'>", 1)[1]


def test_run_page_counts_windowed_texts(logged_in, tree):
    """long_text window: the run page's config table says how many texts were windowed,
    from the tokenize manifest."""
    from tasks.io import storage

    uri = f"{tree}/runs/{DAG_ID}/{RUN_KEY}/tokenize/manifest.json"
    storage.write_json(uri, {"long_text": "window", "window_stride": 8, "splits": {
        "train": {"num_examples": 10, "num_windowed": 3, "num_records": 7},
        "eval": {"num_examples": 4, "num_windowed": 1, "num_records": 6}}})
    text = logged_in.get(f"/bertflow/runs/{DAG_ID}/{RUN_KEY}").text
    assert ("windows overlapping by 8 pieces; train: 3 of 10 texts windowed, 7 windows; "
            "test: 1 of 4 texts windowed, 6 windows") in text
    storage.write_json(uri, {"long_text": "truncate", "splits": {}})
    assert "long texts" not in logged_in.get(f"/bertflow/runs/{DAG_ID}/{RUN_KEY}").text
