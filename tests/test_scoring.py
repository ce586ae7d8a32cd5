"""Batch scoring (issue 46): the reader that keeps bad rows as values, the checks before any
worker starts, bert_batch_score through a real dag.test() with two local worker processes,
a worker SIGKILLed mid-way whose retry scores every row exactly once, worker 0 giving up on a
dead peer that no controller watches, the release teardown, and Parquet output read back
with pyarrow (classification and token classification, local and on S3, a retry).

One tiny classifier is exported once per module (tests/test_export.py's helpers) and promoted
with the real promote step, so `model: champion` follows a real CHAMPION.json."""
from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import threading
import time

import pytest

from tasks.config import parse_config
from tasks.errors import BertflowError, ConfigError, DataError
from tasks.io import storage
from tasks.io.scoring_reader import ScoreFile
from tasks.io.uris import COMPLETE, join_uri
from tasks.params_form import score_param_schemas
from tasks.runs import runlayout
from tasks.runs.runlayout import RunContext, init_run
from tasks.score_config import ScoreConfig, parse_score_config, run_config
from tasks.scoring import plan as scoring_plan, shards
from tasks.steps import export, promote
from storage_servers import S3_CONN_ID, connections, gcs_emulator, root, s3_server  # noqa: F401
from test_export import LABELS, VOCAB, fake_run, write_model

WORDS = [w for w in VOCAB if not w.startswith(("[", "##"))]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """{"root", "export_uri", "version_uri"}: a promoted tiny classifier."""
    tmp = tmp_path_factory.mktemp("scoring")
    model_dir = write_model(tmp / "model")
    ctx = fake_run(tmp, model_dir, run_id="train-1")
    cfg = parse_config({"artifact_root": ctx.artifact_root, "model_name": "tiny"})
    version_uri = runlayout.read_manifest(export.run(cfg, ctx))["version_uri"]
    assert runlayout.read_manifest(promote.run(cfg, ctx))["promoted"]
    return {"root": ctx.artifact_root, "export_uri": cfg.resolved_export_uri(),
            "version_uri": version_uri, "tmp": tmp}


def write_input(path, good: int, seed: int = 0) -> list[str]:
    """A TSV of `good` scoreable rows (ids g0, g1, ...) and three bad ones (b0: bytes that
    are not UTF-8, b1: an empty text, b2: a field too many); returns the good ids."""
    rng = random.Random(seed)
    lines = [b"id\ttext\tnote"]
    ids = []
    for i in range(good):
        ids.append(f"g{i}")
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 9)))
        lines.append(f"g{i}\t{text}\tx".encode())
        if i == good // 3:
            lines.append(b"b0\ta bad \xff\xfe movie\tx")
        if i == good // 2:
            lines.append(b"b1\t  \tx")
            lines.append(b"b2\ta good\tmovie\tx")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return ids


def score_values(store, tmp, **extra) -> dict:
    return {"artifact_root": store["root"], "export_uri": store["export_uri"],
            "model_name": "tiny", "output_uri": str(tmp / "scores"), "id_column": "id",
            **extra}


# --- the config ----------------------------------------------------------------------------
def test_shared_fields_are_run_configs_own():
    from tasks.config import RunConfig

    ours, theirs = (m.model_json_schema()["properties"] for m in (ScoreConfig, RunConfig))
    for name in ("text_column", "num_workers", "provisioner", "max_preemptions"):
        assert ours[name] == theirs[name]
    schemas = score_param_schemas()
    assert set(schemas) == set(ScoreConfig.model_fields)
    assert schemas["model"]["default"] == "champion"
    assert None in schemas["expected_task"]["enum"]  # the form can leave it empty
    with pytest.raises(ConfigError, match="reservation"):  # RunConfig's checks run too
        parse_score_config({"capacity": "reservation"})
    with pytest.raises(ConfigError, match="id_column must differ"):
        parse_score_config({"id_column": "text"})
    assert run_config(parse_score_config({"num_workers": 3})).num_workers == 3


def test_dated_input_and_output_resolve_per_run():
    """Backfills: {ds} and the other placeholders in input_uri and output_uri resolve to the
    run's dates (the validate task's run_values), a bad one is refused naming its field."""
    from datetime import datetime, timezone

    from tasks.io.uri_templates import RunDates, resolve

    day = datetime(2026, 12, 5, tzinfo=timezone.utc)
    values = {"input_uri": "gs://b/tickets/{ds}/", "output_uri": "gs://b/scores/{ds_nodash}",
              "text_column": "{ds}"}
    assert resolve(values, RunDates(day, day, day)) == {
        "input_uri": "gs://b/tickets/2026-12-05/", "output_uri": "gs://b/scores/20261205",
        "text_column": "{ds}"}
    with pytest.raises(ConfigError, match="field 'input_uri'"):
        parse_score_config({"input_uri": "gs://b/{day}/"})


# --- the reader ----------------------------------------------------------------------------
def test_reader_keeps_every_record_as_a_row_or_an_error(tmp_path):
    path = tmp_path / "in.tsv"
    ids = write_input(path, 9)
    source = ScoreFile(str(path), "auto", "text", id_column="id")
    rows = list(source.rows())
    assert [r.id for r in rows if not r.error] == ids
    errors = {r.line: r.error for r in rows if r.error}
    assert errors == {6: "not valid UTF-8 in column 'text'", 8: "empty text in column 'text'",
                      9: "expected 3 fields like the header, found 4"}
    assert source.records == 12 and len(source.sha256) == 64
    assert [r.index for r in source.rows(3, 6)] == [3, 4, 5]
    # Where every 4th record begins: a read from there gives the same rows as from the top.
    source = ScoreFile(str(path), "auto", "text", id_column="id", every=4)
    everything = list(source.rows())
    assert [a["index"] for a in source.starts] == [0, 4, 8]
    for at in source.starts:
        assert list(source.rows(at["index"], at["index"] + 4, at=at)) == \
            everything[at["index"]:at["index"] + 4]


def test_reader_jsonl_names_malformed_lines_and_counts_quoted_csv_lines(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "a good movie"}\n\nnot json\n[1]\n{"text": ""}\n{"other": 1}\n')
    rows = list(ScoreFile(str(path), "auto", "text").rows())
    assert [(r.line, r.error.split(":")[0]) for r in rows] == [
        (1, ""), (3, "malformed JSON"), (4, "expected a JSON object, found list"),
        (5, "empty text in column 'text'"), (6, "no field 'text'")]
    source = ScoreFile(str(path), "auto", "text", every=2)
    everything = list(source.rows())
    assert [(a["index"], a["line"]) for a in source.starts] == [(0, 1), (2, 4), (4, 6)]
    for at in source.starts:
        assert list(source.rows(at["index"], at["index"] + 2, at=at)) == \
            everything[at["index"]:at["index"] + 2]
    csv_path = tmp_path / "in.csv"
    csv_path.write_bytes('\ufefftext,id\n"two\nlines",1\n\nthird é,2\r\nfour,3\n'.encode())
    source = ScoreFile(str(csv_path), "auto", "text", id_column="id", every=1)
    assert [(r.line, r.text, r.id) for r in source.rows()] == [
        (2, "two\nlines", "1"), (5, "third é", "2"), (6, "four", "3")]
    # Offsets count bytes (the BOM, the two-byte é, CRLF): each record read from its own.
    data = csv_path.read_bytes()
    assert [data[a["offset"]:].split(b",")[0] for a in source.starts] == [
        b'"two\nlines"', "third é".encode(), b"four"]
    assert [next(source.rows(a["index"], a["index"] + 1, at=a)).text
            for a in source.starts] == ["two\nlines", "third é", "four"]


@pytest.mark.parametrize("block_size", [5, 1 << 20])
def test_reader_cuts_lines_only_at_newlines_whatever_the_block(tmp_path, block_size):
    """CR, LF and CRLF end lines, as open(newline="") reads them; form feeds, NEL and the
    Unicode line separators stay inside a text; offsets stay exact across small blocks."""
    texts = ["form\x0cfeed", "next\u0085line", "sep\u2028arator", "vt\x0btab", "plain"]
    path = tmp_path / "in.tsv"
    path.write_bytes(("text\r" + "\r\n".join(texts[:3]) + "\n" + "\r".join(texts[3:])
                      ).encode())
    source = ScoreFile(str(path), "auto", "text", every=1, block_size=block_size)
    assert [(r.line, r.text) for r in source.rows()] == list(enumerate(texts, start=2))
    data = path.read_bytes()
    assert [data[a["offset"]:].splitlines()[0].decode() for a in source.starts] == texts


def test_output_rows_keep_each_tasks_outputs_as_served():
    """What serve_rows gives per task (tasks/task_kinds.py serving_outputs) -> output rows:
    entities cut to num_entities as objects, multi-label names without the "" padding."""
    from tasks.steps.score import output_rows

    assert output_rows({"label": ["a", "b"], "probabilities": [[0.9, 0.1], [0.2, 0.8]]},
                       2) == [{"label": "a", "probabilities": [0.9, 0.1]},
                              {"label": "b", "probabilities": [0.2, 0.8]}]
    assert output_rows({"labels": [["x", "", ""]], "probabilities": [[0.7, 0.2, 0.1]]},
                       1) == [{"labels": ["x"], "probabilities": [0.7, 0.2, 0.1]}]
    assert output_rows({"score": [0.5]}, 1) == [{"score": 0.5}]
    served = {"num_entities": [1, 0], "entity_group": [["PER", ""], ["", ""]],
              "start": [[0, -1], [-1, -1]], "end": [[3, -1], [-1, -1]],
              "word": [["Ann", ""], ["", ""]], "score": [[0.9, 0.0], [0.0, 0.0]]}
    assert output_rows(served, 2) == [
        {"entities": [{"entity_group": "PER", "start": 0, "end": 3, "word": "Ann",
                       "score": 0.9}]},
        {"entities": []}]


# --- checks before any worker --------------------------------------------------------------
def test_an_input_without_the_text_column_names_the_file_and_its_columns(store, tmp_path):
    write_input(tmp_path / "in" / "a.tsv", 3)
    cfg = parse_score_config(score_values(store, tmp_path, input_uri=str(tmp_path / "in") + "/",
                                          text_column="review"))
    ctx = RunContext(store["root"], "bert_batch_score", "check-1", "check-1")
    with pytest.raises(DataError) as err:
        scoring_plan.make_plan(cfg, ctx)
    assert str(tmp_path / "in" / "a.tsv") in str(err.value)
    assert "no column 'review'; columns found: id, text, note" in str(err.value)
    assert not storage.exists(scoring_plan.plan_uri(ctx))


def test_a_version_without_complete_or_of_another_task_is_refused(store, tmp_path):
    import shutil

    half = tmp_path / "models" / "tiny" / "v-half"
    shutil.copytree(store["version_uri"], half)
    (half / COMPLETE).unlink()
    cfg = parse_score_config(score_values(store, tmp_path, model=str(half)))
    with pytest.raises(ConfigError, match=f"field 'model'.*{half} is not a completely "
                                          "published model version"):
        scoring_plan.resolve_model(cfg)
    cfg = parse_score_config(score_values(store, tmp_path, expected_task="regression"))
    with pytest.raises(ConfigError, match="is a classification model, not regression"):
        scoring_plan.resolve_model(cfg)
    cfg = parse_score_config(score_values(store, tmp_path, model_name="nobody"))
    with pytest.raises(ConfigError, match="model_name nobody has no champion yet"):
        scoring_plan.resolve_model(cfg)
    cfg = parse_score_config(score_values(store, tmp_path, text_pair_column="note"))
    with pytest.raises(ConfigError, match="takes one text per row; clear text_pair_column"):
        scoring_plan.resolve_model(cfg)
    found = scoring_plan.resolve_model(parse_score_config(score_values(store, tmp_path)))
    assert found["version_uri"] == store["version_uri"]
    assert found["lineage"]["run_id"] == "train-1"


@pytest.mark.parametrize("input_uri, output, refused", [
    ("data/", "data/scores", True),
    ("data/*.tsv", "data/out", True),
    ("data/in.tsv", "data/out", False),  # a file: its folder is not read
    ("data/", "database/out", False),
])
def test_an_output_inside_the_input_folder_is_refused(tmp_path, input_uri, output, refused):
    cfg = parse_score_config({"input_uri": f"{tmp_path}/{input_uri}",
                              "output_uri": str(tmp_path / output)})
    if refused:
        with pytest.raises(ConfigError, match="output_uri.*would score its own output"):
            scoring_plan.check_output(cfg)
    else:
        assert scoring_plan.check_output(cfg) == str(tmp_path / output)


def test_input_and_output_in_a_bucket(store, root, tmp_path, monkeypatch):
    """Input read and shards published on each storage backend (GCS and S3 emulators on
    loopback): the score step's worker in this process, reading its shards from their byte
    offsets (ranged reads), then the publication. On S3 the parts are Parquet, read back
    with pyarrow from the bucket."""
    from tasks.scoring.publish import publish
    from tasks.steps import score

    monkeypatch.delenv("TF_CONFIG", raising=False)
    fmt = "parquet" if root.startswith("s3://") else "jsonl"
    local = tmp_path / "in.tsv"
    ids = write_input(local, 10)
    storage.write_bytes(f"{root}/in/tickets.tsv", local.read_bytes())
    cfg = parse_score_config(score_values(store, tmp_path, input_uri=f"{root}/in/",
                                          output_uri=f"{root}/scores", shard_rows=4,
                                          aws_conn_id=S3_CONN_ID, output_format=fmt))
    key = "bucket-" + hashlib.sha256(root.encode()).hexdigest()[:8]  # one per backend
    ctx = RunContext(store["root"], "bert_batch_score", key, key)
    init_run(run_config(cfg), ctx)
    plan = scoring_plan.make_plan(cfg, ctx)
    assert [s["at"]["offset"] > 0 for s in plan["shards"]] == [True] * 4
    assert score.run(*runlayout.load_run(ctx.run_uri)).endswith("score/manifest.json")
    summary = publish(ctx)
    assert (summary["rows"], summary["error_rows"]) == (10, 3)
    assert summary["output_uri"].startswith(f"{root}/scores/")
    assert sorted(output_ids(summary["output_uri"])) == sorted(ids)
    complete = storage.read_json(join_uri(summary["output_uri"], COMPLETE))
    assert complete["inputs"] == [{"uri": f"{root}/in/tickets.tsv", "records": 13,
                                   "sha256": hashlib.sha256(local.read_bytes()).hexdigest()}]
    assert complete["format"] == fmt
    assert all(entry["path"].endswith(f".{fmt}") for entry in complete["files"])


# --- a worker killed mid-way ---------------------------------------------------------------
def read_part(uri: str) -> list[dict]:
    """The rows of a published part file, JSON Lines or Parquet (read with pyarrow)."""
    if uri.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        return pq.read_table(pa.BufferReader(storage.read_bytes(uri))).to_pylist()
    return [json.loads(line) for line in storage.read_text(uri).splitlines()]


def output_ids(output: str) -> list[str]:
    ids = []
    for uri in sorted(storage.list_uris(output)):
        folder, _, name = uri.rpartition("/")
        if folder == output and name.startswith("part-"):
            ids += [row["id"] for row in read_part(uri)]
    return ids


def test_a_worker_killed_mid_way_is_redone_and_every_row_scored_once(store, tmp_path):
    """Two real local workers (LocalBackend under the attempt loop, as the DAG's score task
    runs them); worker 1 is SIGKILLed once two of its shards are published. The re-provisioned
    attempt skips the published shards (their records unchanged) and scores the rest."""
    from tasks.provision.attempts import read_attempts, run_step
    from tasks.provision.backends import backend_for
    from tasks.provision.local.backend import pid_record_uri
    from tasks.provision.spec import scoring_spec
    from tasks.scoring.publish import publish

    ids = write_input(tmp_path / "in.tsv", 300)
    cfg = parse_score_config(score_values(store, tmp_path, input_uri=str(tmp_path / "in.tsv"),
                                          num_workers=2, shard_rows=4, batch_size=4))
    ctx = RunContext(store["root"], "bert_batch_score", "fault-1", "fault-1")
    init_run(run_config(cfg), ctx)
    plan = scoring_plan.make_plan(cfg, ctx)
    output = plan["output_uri"]
    worker1 = {s["name"] for s in plan["shards"] if s["index"] % 2 == 1}
    killed: dict = {}

    def kill_worker_1():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            done = {n: r for n, r in shards.published(output).items() if n in worker1}
            if len(done) >= 2 and storage.exists(pid_record_uri(ctx.run_uri, "score")):
                pids = storage.read_json(pid_record_uri(ctx.run_uri, "score"))["pids"]
                pid = next(p["pid"] for p in pids if p["index"] == 1)
                killed.update(records=shards.published(output), pid=pid)
                os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_worker_1, daemon=True)
    killer.start()
    rcfg, _ = runlayout.load_run(ctx.run_uri)
    spec = scoring_spec(ctx.run_uri, plan["num_workers"], accelerated=False)
    lines: list[str] = []
    run_step(backend_for(rcfg), rcfg, ctx, spec, log=lines.append, secrets={}).run()
    killer.join(timeout=5)

    assert killed, "worker 1 was never killed"
    before = {n for n in killed["records"] if n in worker1}
    assert before and before < worker1, "the kill did not land mid-way"
    assert [a["outcome"] for a in read_attempts(ctx, "score")] == ["lost", "success"]
    final = shards.published(output)
    for name, record in killed["records"].items():  # published once, never redone
        assert final[name]["started"] == record["started"]
    assert any("already published (skipped)" in line and "worker 1 of 2" in line
               and " 0 already" not in line for line in lines)
    got = output_ids(output)
    assert sorted(got) == sorted(ids) and len(got) == len(set(got)) == 300
    summary = publish(ctx)
    assert (summary["rows"], summary["error_rows"]) == (300, 3)
    # Past max_error_rows the run fails, naming an errors file.
    storage.write_json(join_uri(ctx.run_uri, scoring_plan.SCORE_CONFIG),
                       {**json.loads(cfg.model_dump_json()), "max_error_rows": 2})
    with pytest.raises(BertflowError, match=r"3 rows could not be scored, more than "
                                            r"max_error_rows 2: see .*/errors/part-"):
        publish(ctx)


def start_worker(argv: list[str], env: dict[str, str]):
    """A step process as the local backend starts one (forked from the warm-start server when
    one serves, else cold), with its output collected by a thread: (process, lines)."""
    import subprocess

    from tasks.config import PROJECT_ROOT
    from tasks.provision.local import warm_start

    proc = warm_start.spawn(argv, env, PROJECT_ROOT) or subprocess.Popen(
        argv, env=env, cwd=PROJECT_ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    return proc, lines


def test_worker_0_gives_up_on_a_dead_peer_and_the_retry_scores_the_rest(store, tmp_path):
    """Two real worker processes started as the local backend starts them, but with no
    controller watching them (as on a backend that cannot see a peer die, or a peer that
    hangs): worker 1 is SIGKILLed once it has published a shard. Worker 0 scores its own
    shards, sees no progress for peer_wait_seconds and exits 2 naming worker 1's missing
    shards. The retry (the score task's attempt loop over the local backend) scores only
    those: every row published once. The release step then removes the workers' scratch."""
    import sys

    from tasks.provision.attempts import read_attempts, run_step
    from tasks.provision.backends import backend_for
    from tasks.provision.local.cluster import local_tmp_root, tf_config
    from tasks.provision.spec import process_env, scoring_spec
    from tasks.steps import release

    ids = write_input(tmp_path / "in.tsv", 120)
    cfg = parse_score_config(score_values(store, tmp_path, input_uri=str(tmp_path / "in.tsv"),
                                          num_workers=2, shard_rows=4, batch_size=4,
                                          peer_wait_seconds=3))
    ctx = RunContext(store["root"], "bert_batch_score", "stall-1", "stall-1")
    init_run(run_config(cfg), ctx)
    plan = scoring_plan.make_plan(cfg, ctx)
    output = plan["output_uri"]
    worker1 = {s["name"] for s in plan["shards"] if s["index"] % 2 == 1}
    spec = scoring_spec(ctx.run_uri, 2, accelerated=False)
    # Read for the worker's index only: independent scoring workers bind no port.
    addresses = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
    scratch = local_tmp_root(ctx.run_uri)
    workers = []
    for index in range(2):
        (scratch / f"worker-{index}").mkdir(parents=True, exist_ok=True)
        env = process_env(os.environ, spec.env, {
            "TF_CONFIG": tf_config(addresses, "worker", index),
            "TMPDIR": str(scratch / f"worker-{index}")})
        workers.append(start_worker([sys.executable, *spec.command[1:]], env))
    (worker_0, out_0), (worker_1, _) = workers
    try:
        deadline = time.monotonic() + 300
        while not worker1 & set(shards.published(output)):
            assert worker_1.poll() is None and time.monotonic() < deadline, "no shard of 1"
            time.sleep(0.02)
        os.killpg(worker_1.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        code = worker_0.wait(timeout=240)
        waited = time.monotonic() - killed_at
    finally:
        for proc, _ in workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    before = shards.published(output)
    missing = sorted(worker1 - set(before))
    assert missing and {s["name"] for s in plan["shards"]} - worker1 <= set(before)
    assert code == 2 and waited < 120, (code, waited, out_0[-5:])
    [error] = [line for line in out_0 if line.startswith("bertflow: error: no shard")]
    assert f"{len(missing)} shard(s) missing: " in error and "peer_wait_seconds 3" in error
    assert all(f"{name} (worker 1)" in error for name in missing[:10])
    assert not storage.exists(ctx.manifest_uri("score"))

    # The retry with the default wait: its worker 0 has nothing left to score and waits
    # from the start, while worker 1 loads the model (3 s is for this test's first half).
    storage.write_json(join_uri(ctx.run_uri, scoring_plan.SCORE_CONFIG),
                       {**json.loads(cfg.model_dump_json()), "peer_wait_seconds": 600})
    rcfg, _ = runlayout.load_run(ctx.run_uri)
    lines: list[str] = []
    run_step(backend_for(rcfg), rcfg, ctx, spec, log=lines.append, secrets={}).run()
    assert [a["outcome"] for a in read_attempts(ctx, "score")] == ["success"]
    final = shards.published(output)
    assert all(final[name]["started"] == record["started"] for name, record in before.items())
    assert any(f"worker 1 of 2: {len(worker1)} shard(s), {len(worker1) - len(missing)} "
               "already published" in line for line in lines), lines
    got = output_ids(output)
    assert sorted(got) == sorted(ids) and len(got) == len(set(got)) == 120

    assert scratch.is_dir()
    manifest = runlayout.read_manifest(release.run(rcfg, ctx))
    assert manifest["removed_tmp_root"] == str(scratch) and not scratch.exists()


def test_triggering_events_name_the_input_and_the_promoted_version():
    """The triggering events as the Task SDK hands them over (its own accessor and event
    classes): the newest bertflow-scoring-data event's input_uri wins; a promoted-model
    event (no input_uri) leaves the Param and names the version to score with; a run that
    only other models' promotions triggered has nothing to re-score."""
    from datetime import datetime, timezone

    from airflow.sdk.execution_time.comms import AssetEventDagRunReferenceResult
    from airflow.sdk.execution_time.context import TriggeringAssetEventsAccessor

    from bertflow_airflow.scoring import event_input_uri, other_models_only, \
        promoted_version_uri

    def event(name, extra, day, alias=None):
        return AssetEventDagRunReferenceResult(
            asset={"name": name, "uri": name, "extra": {}}, extra=extra,
            source_task_id="t", source_dag_id="d", source_run_id="r", source_map_index=-1,
            source_aliases=[{"name": alias}] if alias else [],
            timestamp=datetime(2026, 12, day, tzinfo=timezone.utc))

    promoted = event("bertflow-model-tiny", {"version_uri": "/m/v1"}, 3,
                     alias="bertflow-promoted-model")
    accessor = TriggeringAssetEventsAccessor.build([
        event("bertflow-scoring-data", {"input_uri": "gs://b/new/"}, 2),
        event("bertflow-scoring-data", {"input_uri": "gs://b/old/"}, 1), promoted])
    assert event_input_uri({"triggering_asset_events": accessor}) == "gs://b/new/"
    only_promoted = TriggeringAssetEventsAccessor.build([promoted])
    assert event_input_uri({"triggering_asset_events": only_promoted}) is None
    assert event_input_uri({}) is None
    newer = event("bertflow-model-tiny", {"version_uri": "/m/v2"}, 4,
                  alias="bertflow-promoted-model")
    swept = event("bertflow-model-swept", {"version_uri": "/s/v1"}, 5,
                  alias="bertflow-promoted-model")
    both = {"triggering_asset_events": TriggeringAssetEventsAccessor.build(
        [promoted, swept, newer])}
    assert promoted_version_uri(both, "tiny") == "/m/v2"
    assert promoted_version_uri(both, "other") is None
    assert other_models_only(both, "tiny") == []
    assert other_models_only(both, "other") == ["bertflow-model-swept", "bertflow-model-tiny"]
    assert other_models_only({"triggering_asset_events": accessor}, "other") == []  # data
    assert other_models_only({}, "tiny") == []  # triggered by hand


# --- bert_batch_score through dag.test() ---------------------------------------------------
@pytest.fixture(scope="module")
def dag_run(store, airflow_db, tmp_path_factory):
    from airflow.dag_processing.dagbag import DagBag

    from tasks.config import PROJECT_ROOT

    tmp = tmp_path_factory.mktemp("dag")
    ids = write_input(tmp / "in" / "tickets.tsv", 40, seed=1)
    conf = score_values(store, tmp, input_uri=str(tmp / "in") + "/", num_workers=2,
                        shard_rows=7, max_error_rows=3)
    bag = DagBag(dag_folder=str(PROJECT_ROOT / "dags" / "bert_batch_score.py"))
    assert not bag.import_errors
    return bag.dags["bert_batch_score"].test(run_conf=conf), tmp, ids


def test_dag_scores_every_row_with_the_champion(dag_run, store):
    run, tmp, ids = dag_run
    assert {ti.task_id: ti.state for ti in run.get_task_instances()} == {
        "validate": "success", "score": "success", "publish": "success",
        "release": "success"}
    [found] = (tmp / "scores").glob(f"*/{COMPLETE}")
    output = str(found.parent)
    assert output == join_uri(str(tmp / "scores"), runlayout.run_key_for("manual", None,
                                                                          run.run_id))
    complete = storage.read_json(str(found))
    assert (complete["rows"], complete["error_rows"], complete["input_rows"]) == (40, 3, 43)
    assert complete["model"]["version_uri"] == store["version_uri"]
    assert complete["lineage"]["run_id"] == "train-1"
    assert complete["inputs"][0]["uri"] == str(tmp / "in" / "tickets.tsv")
    for entry in complete["files"]:
        data = storage.read_bytes(join_uri(output, entry["path"]))
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        assert len(data.splitlines()) == entry["rows"]
    rows = [json.loads(line) for entry in complete["files"]
            for line in storage.read_text(join_uri(output, entry["path"])).splitlines()]
    assert sorted(r["id"] for r in rows) == sorted(ids)
    version = store["version_uri"].rsplit("/", 1)[-1]
    for row in rows:
        assert row["model_version"] == version and row["label"] in LABELS
        assert sum(row["probabilities"]) == pytest.approx(1.0, abs=1e-4)
        assert row["file"] == str(tmp / "in" / "tickets.tsv") and row["line"] >= 2
    errors = [json.loads(line) for entry in complete["errors"]
              for line in storage.read_text(join_uri(output, entry["path"])).splitlines()]
    assert sorted(e["reason"].split(" ")[0] for e in errors) == ["empty", "expected", "not"]
    assert all(e["file"] == str(tmp / "in" / "tickets.tsv") and e["line"] > 1
               for e in errors)


def test_dag_releases_what_its_workers_left_in_a_teardown(dag_run, store):
    """release (bert_finetune's teardown task) runs after score whatever score's outcome, as
    the teardown of validate (which made the run folder), and leaves no worker process and
    no scratch folder behind."""
    from airflow.dag_processing.dagbag import DagBag

    from tasks.config import PROJECT_ROOT
    from tasks.provision.local.backend import pid_record_uri
    from tasks.provision.local.cluster import local_tmp_root, process_started

    dag = DagBag(dag_folder=str(PROJECT_ROOT / "dags" / "bert_batch_score.py")).dags[
        "bert_batch_score"]
    release = dag.get_task("release")
    assert release.is_teardown and release.trigger_rule == "all_done_setup_success"
    assert dag.get_task("validate").is_setup and "score" in release.upstream_task_ids
    run, _, _ = dag_run
    run_uri = join_uri(store["root"], "runs", "bert_batch_score",
                       runlayout.run_key_for("manual", None, run.run_id))
    manifest = storage.read_json(join_uri(run_uri, "release", "manifest.json"))
    assert manifest["removed_tmp_root"] == str(local_tmp_root(run_uri))
    assert not local_tmp_root(run_uri).exists()
    pids = storage.read_json(pid_record_uri(run_uri, "score"))["pids"]
    assert len(pids) == 2 and all(process_started(p["pid"]) != p["started"] for p in pids)


def test_dag_emits_the_scores_event(dag_run):
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session

    run, tmp, _ = dag_run
    with create_session() as session:
        events = session.query(AssetEvent).filter_by(source_run_id=run.run_id).all()
        assert [e.asset.name for e in events] == ["bertflow-scores"]
        assert events[0].extra["output_uri"].startswith(str(tmp / "scores"))
        assert events[0].extra["rows"] == 40


def test_the_command_line_scores_a_file_in_one_process(store, tmp_path, capsys):
    """init-score, score and publish-scores, as docs/scoring.md shows them (in this process:
    the same main() the module runs)."""
    from tasks.__main__ import main

    ids = write_input(tmp_path / "in.tsv", 5)
    run_dir = str(tmp_path / "runs" / "score-1")
    flags = ["--input-uri", str(tmp_path / "in.tsv"), "--id-column", "id", "--model-name",
             "tiny", "--export-uri", store["export_uri"], "--artifact-root", store["root"],
             "--output-uri", str(tmp_path / "out"), "--shard-rows", "3"]
    assert main(["init-score", "--run-dir", run_dir, *flags]) == 0
    assert "8 rows in 3 shard(s)" in capsys.readouterr().out
    assert main(["score", "--run-dir", run_dir]) == 0
    assert capsys.readouterr().out.strip().endswith("score/manifest.json")
    assert main(["publish-scores", "--run-dir", run_dir]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["rows"], summary["error_rows"], summary["shards"]) == (5, 3, 3)
    assert sorted(output_ids(summary["output_uri"])) == sorted(ids)
    assert main(["init-score", "--run-dir", run_dir, *flags, "--text-column", "body"]) == 2
    assert "no column 'body'; columns found: id, text, note" in capsys.readouterr().err
    # The same plan again keeps the published shards; another input drops them (a retried
    # worker must not skip shards of the old input).
    assert main(["init-score", "--run-dir", run_dir, *flags]) == 0
    assert len(shards.published(summary["output_uri"])) == 3
    write_input(tmp_path / "in.tsv", 6)
    assert main(["init-score", "--run-dir", run_dir, *flags]) == 0
    assert shards.published(summary["output_uri"]) == {}
    assert not storage.exists(join_uri(summary["output_uri"], COMPLETE))


# --- Parquet output ------------------------------------------------------------------------
def test_parquet_parts_hold_every_tasks_outputs(tmp_path, monkeypatch):
    """Each task's rows as output_rows makes them, through the Parquet writer and back with
    pyarrow: the same values (exact in float32, as served), one typed schema per task whose
    metadata names the model version, a row group per ROW_GROUP_ROWS rows; rows with
    fields the schema does not have are refused, not dropped."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tasks.scoring import parts
    from tasks.steps.score import output_rows

    served = {
        "classification": {"label": ["a", "b"], "probabilities": [[0.75, 0.25], [0.5, 0.5]]},
        "multi_label": {"labels": [["x", "", ""], ["", "", ""]],
                        "probabilities": [[0.75, 0.25, 0.125], [0.0, 0.5, 0.25]]},
        "regression": {"score": [0.5, -1.25]},
        "token_classification": {
            "num_entities": [2, 0], "entity_group": [["PER", "LOC"], ["", ""]],
            "start": [[0, 8], [-1, -1]], "end": [[3, 13], [-1, -1]],
            "word": [["Ann", "Paris"], ["", ""]], "score": [[0.75, 0.5], [0.0, 0.0]]}}
    monkeypatch.setattr(parts, "ROW_GROUP_ROWS", 1)
    for task, outputs in served.items():
        rows = [{"file": "in.tsv", "line": 2 + i, "id": f"g{i}", **out, "model_version": "v1"}
                for i, out in enumerate(output_rows(outputs, 2))]
        path = tmp_path / f"{task}.parquet"
        writer = parts.part_writer("parquet", path, task, True,
                                   {"version": "v1", "version_uri": "/m/tiny/v1", "task": task})
        for row in rows:
            writer.write([row])
        writer.close()
        table = pq.read_table(path)
        assert table.to_pylist() == rows
        assert table.schema.names == list(rows[0])
        assert json.loads(table.schema.metadata[parts.METADATA_KEY]) == {
            "version": "v1", "version_uri": "/m/tiny/v1", "task": task}
        assert pq.ParquetFile(path).num_row_groups == 2
    assert table.schema.field("entities").type.value_type.field("start").type == pa.int64()
    writer = parts.part_writer("parquet", tmp_path / "x.parquet", "regression", False,
                               {"version": "v1"})
    with pytest.raises(BertflowError, match=r"fields \['file', 'line', 'model_version', "
                                            r"'score', 'spread'\].*arrow_schema"):
        writer.write([{"file": "f", "line": 1, "score": 0.5, "spread": 0.1,
                       "model_version": "v1"}])


def scored_parts(output: str) -> tuple[dict, list[dict]]:
    """_COMPLETE.json and every row of its files, each file checked against its entry
    (sha256, rows) and read with pyarrow; one schema across the parts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    complete = storage.read_json(join_uri(output, COMPLETE))
    assert complete["format"] == "parquet"
    rows, schemas = [], set()
    for entry in complete["files"]:
        data = storage.read_bytes(join_uri(output, entry["path"]))
        assert entry["path"].endswith(".parquet")
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        table = pq.read_table(pa.BufferReader(data))
        assert table.num_rows == entry["rows"]
        schemas.add(table.schema.to_string(show_schema_metadata=True))
        rows += table.to_pylist()
    assert len(schemas) == 1
    return complete, rows


def test_parquet_output_after_a_retry_that_redoes_only_unpublished_shards(store, tmp_path,
                                                                          monkeypatch, capsys):
    """The score step (in this process) writing Parquet locally; then a lost worker's
    leftovers: part-00001's record never written, part-00003's part file half written and
    its record gone. The retry skips the two published shards (their records unchanged),
    redoes the other two; every input id is in the output once."""
    from tasks.scoring.publish import publish
    from tasks.steps import score

    monkeypatch.delenv("TF_CONFIG", raising=False)
    ids = write_input(tmp_path / "in.tsv", 12, seed=2)
    cfg = parse_score_config(score_values(store, tmp_path, input_uri=str(tmp_path / "in.tsv"),
                                          shard_rows=4, batch_size=3, output_format="parquet"))
    ctx = RunContext(store["root"], "bert_batch_score", "parquet-1", "parquet-1")
    init_run(run_config(cfg), ctx)
    output = scoring_plan.make_plan(cfg, ctx)["output_uri"]
    score.run(*runlayout.load_run(ctx.run_uri))
    first = shards.published(output)
    assert sorted(first) == [f"part-0000{k}" for k in range(4)]
    for name in ("part-00001", "part-00003"):
        os.remove(shards.record_uri(output, name))
    with open(shards.part_uri(output, "part-00003", "parquet"), "r+b") as half:
        half.truncate(40)
    capsys.readouterr()
    score.run(*runlayout.load_run(ctx.run_uri))
    assert "4 shard(s), 2 already published (skipped)" in capsys.readouterr().out
    final = shards.published(output)
    for name in ("part-00000", "part-00002"):
        assert final[name] == first[name]
    for name in ("part-00001", "part-00003"):
        assert final[name]["started"] > first[name]["started"]
    summary = publish(ctx)
    assert (summary["rows"], summary["error_rows"]) == (12, 3)
    complete, rows = scored_parts(output)
    assert sorted(r["id"] for r in rows) == sorted(ids) and len(rows) == 12
    version = store["version_uri"].rsplit("/", 1)[-1]
    for row in rows:
        assert list(row) == ["file", "line", "id", "label", "probabilities", "model_version"]
        assert row["model_version"] == version and row["label"] in LABELS
        assert sum(row["probabilities"]) == pytest.approx(1.0, abs=1e-4)
        assert row["file"] == str(tmp_path / "in.tsv") and row["line"] >= 2


NER_TAGS = ["O", "B-PER", "I-PER"]


@pytest.fixture(scope="module")
def ner_version(store):
    """The URI of a token-classification version (tags O, B-PER, I-PER; a tiny random
    encoder), exported by the real export step from hand-made upstream manifests."""
    tmp = store["tmp"] / "ner"
    ctx = fake_run(tmp, write_model(tmp / "model", labels=NER_TAGS), run_id="ner-1")
    for step in ("data", "tokenize"):
        manifest = runlayout.read_manifest(ctx.manifest_uri(step))
        runlayout.write_manifest(ctx.step_uri(step), {
            **manifest, "task": "token_classification", "labels": NER_TAGS})
    storage.write_json(f"{ctx.step_uri('evaluate')}/metrics.json", {
        "task": "token_classification", "num_examples": 4, "labels": NER_TAGS, "f1": 0.5,
        "macro_f1": 0.5, "precision": 0.5, "recall": 0.5})
    cfg = parse_config({"artifact_root": ctx.artifact_root, "model_name": "tiny-ner",
                        "task": "token_classification"})
    return runlayout.read_manifest(export.run(cfg, ctx))["version_uri"]


def test_parquet_entities_of_a_token_classification_model(ner_version, store, tmp_path,
                                                           monkeypatch):
    """A token-classification version scores a JSON Lines file; its Parquet parts, read back
    with pyarrow, hold each row's entities with character offsets that cut the entity's word
    out of the input text. (Parquet through a bucket: test_input_and_output_in_a_bucket.)"""
    from tasks.scoring.publish import publish
    from tasks.steps import score

    monkeypatch.delenv("TF_CONFIG", raising=False)
    rng = random.Random(3)
    texts = {f"n{i}": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8)))
             for i in range(9)}
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": k, "text": t}) + "\n" for k, t in texts.items()))
    cfg = parse_score_config(score_values(
        store, tmp_path, input_uri=str(path), model=ner_version, shard_rows=5,
        expected_task="token_classification", output_format="parquet"))
    ctx = RunContext(store["root"], "bert_batch_score", "ner-1", "ner-1")
    init_run(run_config(cfg), ctx)
    output = scoring_plan.make_plan(cfg, ctx)["output_uri"]
    score.run(*runlayout.load_run(ctx.run_uri))
    publish(ctx)
    complete, rows = scored_parts(output)
    assert complete["model"]["task"] == "token_classification"
    assert sorted(r["id"] for r in rows) == sorted(texts)
    entities = [(row["id"], e) for row in rows for e in row["entities"]]
    assert entities, "the random model found no entity: nothing checked"
    for key, entity in entities:
        assert texts[key][entity["start"]:entity["end"]] == entity["word"]
        assert entity["entity_group"] == "PER" and 0 <= entity["score"] <= 1


# --- Parquet input -------------------------------------------------------------------------
def write_parquet_input(path, rows: int = 50) -> list:
    """A Parquet file of `rows` rows in row groups of 8 (ticket, body, n); rows 7 and 20 have
    a blank and a null body. Returns the bodies."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(3)
    bodies = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))
              for _ in range(rows)]
    bodies[7], bodies[20] = "  ", None
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"ticket": [f"t{i}" for i in range(rows)], "body": bodies,
                             "n": list(range(rows))}), path, row_group_size=8)
    return bodies


def test_parquet_input_is_read_by_row_group_with_its_row_numbers(root, tmp_path, monkeypatch):
    """A .parquet input on each storage backend (gs:// and s3:// through ranged reads): the
    plan's pass counts and hashes it; a shard reads only the row groups that hold its rows
    (row groups of 8: rows 10-21 are in groups 1 and 2); rows keep their row numbers; a
    blank or null text is a row error; a missing column names the file and its columns."""
    import pyarrow.parquet as pq

    from tasks.io.scoring_parquet import ParquetScoreFile, open_score_file

    local = tmp_path / "a.parquet"
    bodies = write_parquet_input(local)
    uri = f"{root}/in/a.parquet"
    storage.write_bytes(uri, local.read_bytes())
    source = open_score_file(uri, "auto", "body", id_column="ticket", every=6)
    assert isinstance(source, ParquetScoreFile)
    assert list(source.rows(0, 0)) == [] and source.records == 50
    assert source.sha256 == hashlib.sha256(local.read_bytes()).hexdigest()
    assert source.starts == [{"index": i} for i in range(0, 50, 6)]
    groups = []
    read = pq.ParquetFile.iter_batches
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", lambda self, **kw: (
        groups.append(kw["row_groups"]), read(self, **kw))[1])
    rows = list(source.rows(10, 22, at={"index": 10}))
    assert groups == [[1, 2]]
    assert [(r.index, r.line) for r in rows] == [(i, i + 1) for i in range(10, 22)]
    assert [r.id for r in rows if not r.error] == [f"t{i}" for i in range(10, 22) if i != 20]
    assert rows[20 - 10].error == "empty text in column 'body'"
    assert [r.text for r in rows if not r.error] == [b.strip() for b in bodies[10:22] if b]
    assert [r.error for r in source.rows(0, 9, at={"index": 0}) if r.error] == [
        "empty text in column 'body'"]
    with pytest.raises(DataError, match=r"a\.parquet.*no column 'text'; columns found: "
                                        r"ticket, body, n"):
        open_score_file(uri, "auto", "text").check_columns()


def test_a_parquet_input_is_scored_with_its_row_numbers(store, tmp_path, capsys):
    """init-score, score and publish-scores on a prefix holding a Parquet file (and a marker
    file): every row scored once or kept as an error, each named by its row number."""
    from tasks.__main__ import main

    bodies = write_parquet_input(tmp_path / "in" / "a.parquet")
    (tmp_path / "in" / "_SUCCESS").write_text("")
    run_dir = str(tmp_path / "runs" / "score-pq")
    flags = ["--input-uri", str(tmp_path / "in") + "/", "--text-column", "body",
             "--id-column", "ticket", "--model-name", "tiny", "--export-uri",
             store["export_uri"], "--artifact-root", store["root"], "--output-uri",
             str(tmp_path / "out"), "--shard-rows", "16"]
    assert main(["init-score", "--run-dir", run_dir, *flags]) == 0
    assert "50 rows in 4 shard(s)" in capsys.readouterr().out
    assert main(["score", "--run-dir", run_dir]) == 0
    capsys.readouterr()
    assert main(["publish-scores", "--run-dir", run_dir]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["rows"], summary["error_rows"]) == (48, 2)
    output = summary["output_uri"]
    rows = [row for uri in sorted(storage.list_uris(output))
            if uri.rpartition("/")[0] == output and uri.rpartition("/")[2].startswith("part-")
            for row in read_part(uri)]
    assert sorted(r["id"] for r in rows) == sorted(f"t{i}" for i, b in enumerate(bodies)
                                                   if b and b.strip())
    assert all(r["line"] == int(r["id"][1:]) + 1 and r["label"] in LABELS for r in rows)
    errors = [json.loads(line) for uri in storage.list_uris(join_uri(output, "errors"))
              for line in storage.read_text(uri).splitlines()]
    assert sorted(e["line"] for e in errors) == [8, 21]
