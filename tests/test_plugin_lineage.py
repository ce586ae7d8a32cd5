"""The bertflow page's lineage views, served by Airflow's real api-server app (in process, with
a JWT) over the synthetic artifact tree of tests/plugin_helpers.py, with a `lineage.json` as
the export step writes it (tasks/runs/lineage.py) in each version: a version's page answers
"which data produced version N", the data page "which versions came from this data"."""
from __future__ import annotations

import html
import re

import pytest

from plugin_helpers import DAG_ID, MODEL, RUNS, api_server, build_artifacts, logged_in  # noqa: F401
from tasks.config import parse_config
from tasks.io.uris import join_uri
from tasks.io import storage
from tasks.runs import lineage

SHA_A, SHA_B, TOKENS = "a1" * 32, "b2" * 32, "c3" * 32
# run_key -> (train URI, its sha256)
DATA = {key: (("gs://reviews/2024-01/train.csv", SHA_A) if i < 2 else
              ("s3://other/<odd>/train.jsonl", SHA_B)) for i, key in enumerate(RUNS)}


@pytest.fixture
def tree(artifact_root):
    build_artifacts(artifact_root)
    for run_key, (_, _, run_id, config, _, acc, f1, version) in RUNS.items():
        uri, sha = DATA[run_key]
        version_uri = join_uri(artifact_root, "models", MODEL, version)
        storage.write_json(join_uri(version_uri, lineage.LINEAGE), {
            "model_name": MODEL, "version": version, "version_uri": version_uri,
            "data": {"train": {"uri": uri, "sha256": sha, "files": [{"uri": uri, "sha256": sha}]}},
            "tfrecord_cache_key": TOKENS if sha == SHA_A else "d4" * 32,
            "config": {**parse_config({}).model_dump(mode="json"), **config},
            "base_model": {"source": "hf://bert-base-uncased", "revision": "86b5e09",
                           "sha256": "e5" * 32},
            "code": {"bertflow": "0.5.0", "git_commit": "f6" * 20},
            "dag_id": DAG_ID, "run_id": run_id, "run_key": run_key,
            "experiment": run_key.split("__")[0], "metrics": {"accuracy": acc, "macro_f1": f1}})
    return artifact_root


def _versions(page: str) -> list[str]:
    return re.findall(r"<tr class='version'><td class='l'><a href='[^']*'>"
                      rf"{MODEL} (v[0-9T]+-[a-z]+)</a>", page)


def test_version_page_shows_what_produced_it(logged_in, tree):
    run_key = next(iter(RUNS))
    version = RUNS[run_key][-1]
    page = logged_in.get(f"/bertflow/models/{MODEL}/{version}").text
    assert "gs://reviews/2024-01/train.csv" in page and SHA_A in page and TOKENS in page
    assert "hf://bert-base-uncased" in page and "86b5e09" in page and "e5" * 32 in page
    assert "f6" * 20 in page and html.escape(RUNS[run_key][2]) in page
    assert f"href='../../data?q={SHA_A}'" in page  # each hash leads to its other versions
    assert f"href='../../runs/{DAG_ID}/{run_key}'" in page
    assert "<th class='l'>learning_rate</th><td class='l'>5e-05</td>" in page
    index = logged_in.get("/bertflow/").text  # the models table links each version's page
    assert f"href='models/{MODEL}/{version}'>lineage</a>" in index


def test_data_page_lists_the_versions_from_that_data(logged_in, tree):
    from_a = sorted(RUNS[k][-1] for k in RUNS if DATA[k][1] == SHA_A)
    assert len(from_a) == 2
    for query in (SHA_A, "gs://reviews/2024-01/train.csv", "gs://reviews/", TOKENS):
        page = logged_in.get("/bertflow/data", params={"q": query}).text
        assert sorted(_versions(page)) == from_a, query
    other = logged_in.get("/bertflow/data", params={"q": SHA_B}).text
    assert len(_versions(other)) == 1 and "&lt;odd&gt;" not in other  # listed, not echoed
    none = logged_in.get("/bertflow/data", params={"q": "ff" * 32}).text
    assert _versions(none) == [] and "No version came from data matching that." in none
    # A partial hash names nothing (a hash must match whole); the query is escaped back.
    page = logged_in.get("/bertflow/data", params={"q": SHA_A[:12] + "<b>"}).text
    assert _versions(page) == [] and "&lt;b&gt;" in page and "<b>" not in page


def test_lineage_pages_need_a_login_and_a_listed_version(api_server, logged_in, tree):
    version = RUNS[next(iter(RUNS))][-1]
    for path in (f"/bertflow/models/{MODEL}/v20240301T000000-dddddddd",  # not complete
                 f"/bertflow/models/{MODEL}/..%2F..", f"/bertflow/models/{MODEL}/{version}"
                 "?location=%2Fetc"):
        assert logged_in.get(path).status_code in (400, 404), path
    client, _ = api_server
    client.cookies.clear()  # the same client as logged_in, now without the login cookie
    for path in (f"/bertflow/models/{MODEL}/{version}", f"/bertflow/data?q={SHA_A}"):
        assert client.get(path).status_code == 401, path
        assert client.get(path, headers={"Authorization": "Bearer x.y.z"}).status_code == 403
