"""A sweep on the bertflow page, served by Airflow's real api-server app (in process, with a
JWT), over a 2-trial sweep written by the pipeline's own code (tests/plugin_helpers.py,
build_sweep: tasks/runs/sweep.py's folders, pick_best, the gate and promote steps on the best
trial) beside the plain runs of build_artifacts.

The experiments table used to list a sweep and its trials as rows that all read the same run
id, the sweep's own row empty; the sweep's page said "Not evaluated yet" and "Not exported
yet" although its best trial was evaluated, exported and gated."""
from __future__ import annotations

import html
import re

import pytest

from plugin_helpers import (DAG_ID, MODEL, SWEEP_DAG, SWEEP_KEY, SWEEP_METRICS,  # noqa: F401
                            SWEEP_VERSION, api_server, build_artifacts, build_sweep,
                            logged_in)
from tasks.io.uris import join_uri
from tasks.io import storage

TRIAL_1, TRIAL_2 = f"{SWEEP_KEY}__trial-01", f"{SWEEP_KEY}__trial-02"
LABEL_1 = "learning_rate=3e-05, per_replica_batch_size=16"
LABEL_2 = "learning_rate=5e-05, per_replica_batch_size=16"


@pytest.fixture
def swept(artifact_root, tmp_path):
    build_artifacts(artifact_root)
    return build_sweep(artifact_root, tmp_path / "scratch")


def _group(page: str, experiment: str) -> list[str]:
    """The experiments table's run rows of one experiment, in page order."""
    table = page.split("<table class='experiments'>", 1)[1].split("</table>", 1)[0]
    return re.findall(rf"<tr class='run' data-kind='\w+' data-experiment='{experiment}'.*?</tr>",
                      table, flags=re.S)


def _cells(row: str) -> list[str]:
    return [c.strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)]


def _kind(row: str) -> str:
    return re.search(r"data-kind='(\w+)'", row)[1]


def _name(row: str) -> str:
    """The run link's text in a row's first cell."""
    return html.unescape(re.search(r"<a href='runs/[^']+'>([^<]+)</a>", row)[1])


def test_trials_are_labelled_by_their_values_under_their_sweep(logged_in, swept):
    page = logged_in.get("/bertflow/")
    assert page.status_code == 200, page.text
    assert "experiment tune (1 sweep of 2 trials)" in page.text
    rows = _group(page.text, "tune")
    assert [_kind(r) for r in rows] == ["sweep", "trial", "trial"]
    assert [re.search(r"data-run='([^']+)'", r)[1] for r in rows] == \
        [SWEEP_KEY, TRIAL_1, TRIAL_2]
    # Three rows, three names: the sweep by its date, each trial by its searched values.
    assert [_name(r) for r in rows] == ["2024-04-01T00:00:00+00:00", LABEL_1, LABEL_2]
    assert f"href='runs/{SWEEP_DAG}/{TRIAL_1}'" in rows[1]
    assert "<span class='badge'>trial 1</span>" in rows[1]
    assert "<span class='badge'>trial 2, best</span>" in rows[2]
    # Trials can be ticked for the compare page; the sweep folder (it trains nothing) not.
    boxes = [re.findall(r"<input type='checkbox' form='compare' name='run' value='([^']+)'>",
                        r) for r in rows]
    assert boxes == [[], [f"{SWEEP_DAG}/{TRIAL_1}"], [f"{SWEEP_DAG}/{TRIAL_2}"]]
    # Each trial's own figures: learning rate, accuracy, macro-F1.
    for row, (index, lr) in zip(rows[1:], ((1, "3e-05"), (2, "5e-05"))):
        cells = _cells(row)
        accuracy, f1 = SWEEP_METRICS[index]
        assert (cells[1], cells[7], cells[8]) == (lr, f"{accuracy:g}", f"{f1:g}")


def test_a_sweep_s_row_shows_its_best_trial_s_figures(logged_in, swept):
    rows = _group(logged_in.get("/bertflow/").text, "tune")
    sweep, best = _cells(rows[0]), _cells(rows[2])
    assert "figures of its best trial, trial 2" in rows[0]
    assert "sweep, 2 trials" in rows[0]
    accuracy, f1 = SWEEP_METRICS[2]
    assert sweep[7:9] == [f"{accuracy:g}", f"{f1:g}"]
    # Every figure column is the best trial's, the exported version (its card) included.
    assert sweep[1:] == best[1:]
    assert f"<a href='models/{MODEL}/{SWEEP_VERSION}/card'>{SWEEP_VERSION}</a>" in sweep[-1]
    card = logged_in.get(f"/bertflow/models/{MODEL}/{SWEEP_VERSION}/card")
    assert card.status_code == 200 and SWEEP_VERSION in card.text


@pytest.mark.parametrize("order, trials", [("asc", [TRIAL_1, TRIAL_2]),
                                           ("desc", [TRIAL_2, TRIAL_1])])
def test_sorting_keeps_trials_under_their_sweep(logged_in, swept, order, trials):
    page = logged_in.get(f"/bertflow/?sort=accuracy&order={order}").text
    keys = [re.search(r"data-run='([^']+)'", r)[1] for r in _group(page, "tune")]
    assert keys == [SWEEP_KEY, *trials]


def test_a_sweep_s_page_shows_its_best_trial_s_evaluation_model_and_gate(logged_in, swept):
    page = logged_in.get(f"/bertflow/runs/{SWEEP_DAG}/{SWEEP_KEY}")
    assert page.status_code == 200, page.text
    text = page.text
    assert "Not evaluated yet" not in text and "Not exported yet" not in text
    assert f"<h2>Sweep {SWEEP_DAG} / {SWEEP_KEY}</h2>" in text
    # Each section says whose figures these are, with a link to that trial.
    assert text.count(f"Of the best trial, <a href='{TRIAL_2}'>{LABEL_2}</a>.") == 3
    accuracy, f1 = SWEEP_METRICS[2]
    assert f"accuracy <b>{accuracy:g}</b>, macro-F1 <b>{f1:g}</b> on 34 examples" in text
    # The trials table: the validation figure each was ranked by, its steps and its end.
    rows = re.findall(r"<tr class='trial'>.*?<td class='validation'>([^<]*)</td><td "
                      r"class='steps'>([^<]*)</td><td class='l outcome'>([^<]*)</td>", text)
    assert rows == [(f"{SWEEP_METRICS[i][0] - 0.0625:g}", str(10 * i), "trained to the end")
                    for i in (1, 2)]
    assert "Best trial by validation accuracy" in text
    matrix = re.search(r"<svg class='confusion'.*?</svg>", text, flags=re.S)[0]
    assert ">9</text>" in matrix  # the best trial's matrix: [[10,1,1],[2,9,1],[0,1,9]]
    # The best trial's curves (20 history records), and its TensorBoard folder.
    points = re.search(r"<polyline class='loss' points='([^']+)'", text)[1].split()
    assert len(points) == 20
    assert f"runs/{SWEEP_DAG}/{TRIAL_2}/train/tensorboard</code>" in text
    # The version the sweep exported (from its best trial's folder) and the gate's verdict.
    gate = swept["gate"]
    exported = re.search(r"<p class='exported'>(.*?)</p>", text, flags=re.S)[1]
    assert (f"Exported as <a href='../../models/{MODEL}/{SWEEP_VERSION}/card'>{MODEL} "
            f"{SWEEP_VERSION}</a>") in exported
    verdict = "passed" if gate["passed"] else "refused"
    assert (f"Quality gate: <span class='{verdict}'>{verdict}</span> "
            f"({html.escape(gate['reason'], quote=False)})") in text
    # "compare with…": the trials, all at once (the sweep folder itself trains nothing).
    assert re.findall(r"<a class='compare' href='[^']+'>([^<]+)</a>", text) == \
        ["compare all 2 trials"]
    # The config table: the shared config, with every value a searched field took.
    assert "<th class='l'>learning rate</th><td class='l'>searched: 3e-05, 5e-05</td>" in text


def test_the_gate_s_verdict_when_the_best_trial_passed(logged_in, artifact_root, tmp_path):
    """Without a better champion the gate passes and the version is promoted."""
    built = build_sweep(artifact_root, tmp_path / "scratch")
    assert built["gate"]["passed"], built["gate"]
    text = logged_in.get(f"/bertflow/runs/{SWEEP_DAG}/{SWEEP_KEY}").text
    assert "Quality gate: <span class='passed'>passed</span>" in text
    assert f"{SWEEP_VERSION}</a>; promoted" in text
    index = logged_in.get("/bertflow/").text
    sweep_row = _group(index, "tune")[0]
    assert f"&#9733; <a href='models/{MODEL}/{SWEEP_VERSION}/card'>" in sweep_row  # champion


def test_a_trial_s_page_names_its_sweep(logged_in, swept):
    text = logged_in.get(f"/bertflow/runs/{SWEEP_DAG}/{TRIAL_2}").text
    assert (f"Trial 2 of 2 of the sweep <a href='{SWEEP_KEY}'>{SWEEP_KEY}</a>: "
            f"<b>{LABEL_2}</b>") in text
    assert "the sweep's best" in text
    assert "the sweep's best" not in logged_in.get(
        f"/bertflow/runs/{SWEEP_DAG}/{TRIAL_1}").text
    # "compare with…" names the other trial by its values, not by the date they share.
    links = re.findall(r"<a class='compare' href='[^']+'>([^<]+)</a>", text)
    assert links == [LABEL_1]


def test_the_compare_page_labels_trials(logged_in, swept):
    text = logged_in.get(f"/bertflow/compare?run={SWEEP_DAG}/{TRIAL_1}"
                         f"&run={SWEEP_DAG}/{TRIAL_2}").text
    legend = re.search(r"<table class='runs'>.*?</table>", text, flags=re.S)[0]
    assert LABEL_1 in legend and LABEL_2 in legend


def test_a_sweep_before_its_best_trial_is_chosen(logged_in, swept):
    storage.delete_prefix(join_uri(swept["sweep"].run_uri, "best"))
    rows = _group(logged_in.get("/bertflow/").text, "tune")
    assert "no best trial chosen yet" in rows[0]
    assert _cells(rows[0])[7:9] == ["–", "–"]  # no trial's figures stand in for the sweep
    assert "<span class='badge'>trial 2</span>" in rows[2]
    text = logged_in.get(f"/bertflow/runs/{SWEEP_DAG}/{SWEEP_KEY}").text
    assert "No best trial chosen yet" in text and "Of the best trial" not in text


@pytest.mark.parametrize("trials", [
    [{"run_key": SWEEP_KEY, "values": {"learning_rate": 1}}],  # itself: no recursion
    [{"run_key": "..", "label": "up"}, {"run_key": "../../etc"}, 7, None, "x"],
    [{"run_key": TRIAL_1, "values": ["not", "a", "dict"], "label": "kept label"}],
    [{"run_key": TRIAL_1, "index": "one"}, {"run_key": TRIAL_1, "index": 2}],  # twice
])
def test_damaged_sweep_files_do_not_break_the_pages(logged_in, swept, trials):
    """sweep.json and best/manifest.json are data: odd trials are skipped, a best that is not
    one of the trials is no best, and the pages still render."""
    sweep_uri = swept["sweep"].run_uri
    record = storage.read_json(join_uri(sweep_uri, "sweep.json"))
    storage.write_json(join_uri(sweep_uri, "sweep.json"), {**record, "trials": trials})
    storage.write_json(join_uri(sweep_uri, "best", "manifest.json"),
                       {"best": {"run_key": SWEEP_KEY}})
    for path in ("/bertflow/", f"/bertflow/runs/{SWEEP_DAG}/{SWEEP_KEY}",
                 f"/bertflow/runs/{SWEEP_DAG}/{TRIAL_1}"):
        response = logged_in.get(path)
        assert response.status_code == 200, (path, response.text[:300])
    assert "/etc" not in logged_in.get(f"/bertflow/runs/{SWEEP_DAG}/{SWEEP_KEY}").text


def test_sweep_pages_need_a_login(api_server, swept):
    client, _ = api_server
    client.cookies.clear()
    for path in (f"/bertflow/runs/{SWEEP_DAG}/{SWEEP_KEY}", f"/bertflow/runs/{SWEEP_DAG}/{TRIAL_2}"):
        assert client.get(path).status_code == 401, path
