"""The real scheduler against a real metadata database: a throwaway PostgreSQL cluster on
loopback (tests/postgres_server.py) behind `airflow standalone` (api-server, scheduler with
LocalExecutor, dag-processor, triggerer), with BERTFLOW_SCHEDULE=@daily so that the DAG is
periodic. Driven only through the `airflow` CLI and the REST API:

- a bad conf in `airflow backfill create` is refused (Airflow 3.3 validates the conf against
  the DAG's Params when the backfill is created), naming the field; no run is created;
- the scheduler itself creates the scheduled run of the latest complete @daily interval when
  the DAG is unpaused (catchup off);
- a backfill over 2 dates, `train_uri` = `{data}/{ds}/train.tsv`: both runs succeed (at once:
  max-active-runs 2), each run's data manifest names its own partition and row count, 2 model
  versions record the experiment and the date;
- the same dates with another experiment and learning rate need `--reprocess-behavior
  completed`; then a date exp-a ran gets a new run folder, and the first experiment's run
  folders and model versions are byte-for-byte unchanged;
- `--reprocess-behavior completed` on one date re-runs it in its own folder and reuses the
  tokenized-data cache.

Tiny model (tests/train_helpers.py) and tiny config: the pipeline, not the model, is under
test. The tests share one server and run in file order. Every process (airflow and postgres)
is stopped by the fixtures' finalizers, even on failure.
"""
from __future__ import annotations

import csv
import hashlib
import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import quote

import pytest

from tasks.config import PROJECT_ROOT

from postgres_server import PostgresServer
from train_helpers import tiny_model_dir  # noqa: F401  (fixture)
from ui_helpers import Standalone

DAG_ID = "bert_finetune"
# Two dates: distinct partitions and concurrent runs are what is under test; each more date
# costs a whole DAG run per backfill.
DATES = ["2026-10-01", "2026-10-02"]
ROWS = {"2026-10-01": 150, "2026-10-02": 200}  # rows per partition
TINY = {"max_steps": 2, "max_seq_length": 32, "epochs": 1, "per_replica_batch_size": 8,
        "num_shards": 1, "eval_batch_size": 64, "mixed_precision": "none"}
EXP_A, EXP_B = "exp-a", "exp-b"
BACKFILL_TIMEOUT = 15 * 60  # generous: a loaded 2-core machine is ~3x slower


def _driver_missing() -> str | None:
    try:
        import asyncpg  # noqa: F401
        import psycopg2  # noqa: F401
    except ImportError as err:
        return (f"{err.name} is not installed: Airflow needs psycopg2 (sync) and asyncpg "
                "(async engine) for a PostgreSQL metadata DB (pip install psycopg2-binary "
                "asyncpg, or apache-airflow[postgres])")
    return None


# --- fixtures ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def postgres():
    missing = _driver_missing()
    assert missing is None, missing
    pg = PostgresServer()
    try:
        pg.start()
        yield pg
    finally:
        survivors = pg.stop()
        assert not survivors, f"postgres processes left: {survivors}"


@pytest.fixture(scope="module")
def partitions(tmp_path_factory) -> Path:
    """{data}/{date}/train.tsv, each a different slice of the demo data (different sizes)."""
    root = tmp_path_factory.mktemp("partitions")
    with open(PROJECT_ROOT / "examples" / "demo" / "train.tsv", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    header, body = rows[0], rows[1:]
    for k, day in enumerate(DATES):
        start = 20 * k
        part = body[start:start + ROWS[day]]
        assert len(part) == ROWS[day]
        (root / day).mkdir()
        with open(root / day / "train.tsv", "w", newline="") as f:
            csv.writer(f, delimiter="\t", lineterminator="\n").writerows([header, *part])
    return root


@pytest.fixture(scope="module")
def server(postgres, tmp_path_factory):
    home = tmp_path_factory.mktemp("pg-standalone-home")
    artifacts = tmp_path_factory.mktemp("pg-standalone-artifacts")
    srv = Standalone(home, artifacts, extra_env={
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres.url,
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        # Periodic: backfills need it; the scheduler creates the latest interval's run.
        "BERTFLOW_SCHEDULE": "@daily",
    })
    started = time.monotonic()
    try:
        srv.start(timeout=300)
        print(f"\nairflow standalone on PostgreSQL healthy on {srv.base} after "
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
        assert not survivors, f"processes left after stopping airflow standalone: {survivors}"


def conf_for(partitions: Path, model_dir: Path, experiment: str, learning_rate: float) -> dict:
    return {**TINY, "train_uri": f"{partitions}/{{ds}}/train.tsv", "base_model": str(model_dir),
            "experiment": experiment, "learning_rate": learning_rate}


# --- helpers ----------------------------------------------------------------------------

def runs(server, run_type: str | None = None) -> list[dict]:
    resp = server.api("GET", f"/dags/{DAG_ID}/dagRuns", params={"limit": 100})
    assert resp.status_code == 200, resp.text
    out = resp.json()["dag_runs"]
    return [r for r in out if run_type is None or r["run_type"] == run_type]


def backfill(server, start: str, end: str, conf: dict, reprocess: str = "none") -> dict:
    """A backfill over [start, end] created by the REST API (the `_create_backfill` of `airflow
    backfill create`, without an `airflow` CLI process: the CLI's own path is the bad-conf
    test's); waits for its runs to end, completes it and returns its runs by date."""
    resp = server.api("POST", "/backfills", json={
        "dag_id": DAG_ID, "from_date": f"{start}T00:00:00Z", "to_date": f"{end}T00:00:00Z",
        "dag_run_conf": conf, "reprocess_behavior": reprocess, "max_active_runs": 2})
    assert resp.status_code == 200, resp.text
    backfill_id = resp.json()["id"]
    started = time.monotonic()

    def runs_ended():
        # A reprocessed run was set back to queued when the backfill was created.
        ours = [r for r in runs(server, "backfill") if start <= r["logical_date"][:10] <= end]
        return ours if ours and all(r["state"] in ("success", "failed") for r in ours) \
            else None

    server.wait_for(f"backfill {backfill_id}'s runs to end", runs_ended,
                    timeout=BACKFILL_TIMEOUT, interval=2)
    complete(server, backfill_id)
    print(f"\nbackfill {backfill_id} {start}..{end} reprocess {reprocess}: complete after "
          f"{time.monotonic() - started:.0f}s")
    by_date = {r["logical_date"][:10]: r for r in runs(server)
               if r["run_type"] == "backfill" and start <= r["logical_date"][:10] <= end}
    for day, run in sorted(by_date.items()):
        took = (datetime.fromisoformat(run["end_date"]) - datetime.fromisoformat(
            run["start_date"])).total_seconds() if run.get("end_date") else None
        print(f"  {run['dag_run_id']} ({day}): {run['state']}, {took:.0f}s" if took else
              f"  {run['dag_run_id']} ({day}): {run['state']}")
    failed = {d: r for d, r in by_date.items() if r["state"] != "success"}
    for day, run in failed.items():
        print(failed_task_logs(server, run["dag_run_id"]))
    return by_date


def complete(server, backfill_id: int) -> None:
    """Marks a backfill whose runs have all ended complete, as the scheduler's
    _mark_backfills_complete does on a hard-coded 30 s timer: a DAG takes one backfill at a
    time, and the next one would wait for it. Airflow's cancel sets completed_at (and fails
    queued runs: there are none); 409 if the scheduler was first."""
    resp = server.api("PUT", f"/backfills/{backfill_id}/cancel")
    assert resp.status_code in (200, 409), resp.text
    assert server.api("GET", f"/backfills/{backfill_id}").json()["completed_at"]


def dry_run(server, start: str, end: str, conf: dict, reprocess: str = "none") -> list[str]:
    """The dates a backfill would run, by the REST API's dry run (what `airflow backfill
    create --dry-run` computes, without an `airflow` CLI process to start)."""
    resp = server.api("POST", "/backfills/dry_run", json={
        "dag_id": DAG_ID, "from_date": f"{start}T00:00:00Z", "to_date": f"{end}T00:00:00Z",
        "dag_run_conf": conf, "reprocess_behavior": reprocess})
    assert resp.status_code == 200, resp.text
    return sorted({b["logical_date"][:10] for b in resp.json()["backfills"]})


def failed_task_logs(server, run_id: str) -> str:
    quoted = quote(run_id, safe="")
    tis = server.api("GET", f"/dags/{DAG_ID}/dagRuns/{quoted}/taskInstances").json()
    out = []
    for ti in tis.get("task_instances", []):
        if ti["state"] in ("failed", "upstream_failed", "up_for_retry"):
            resp = server.api("GET", f"/dags/{DAG_ID}/dagRuns/{quoted}/taskInstances/"
                                     f"{ti['task_id']}/logs/{max(1, ti['try_number'])}",
                              params={"full_content": "true"},
                              headers={"Accept": "application/json"})
            text = "\n".join(c.get("event", "") if isinstance(c, dict) else str(c)
                             for c in resp.json().get("content", [])) \
                if resp.status_code == 200 else resp.text
            out.append(f"---- {run_id} {ti['task_id']}: {ti['state']}\n{text[-3000:]}")
    return "\n".join(out)


def run_folder(server, experiment: str, day: str) -> Path:
    return Path(server.artifact_root) / "runs" / DAG_ID / f"{experiment}__{day}T00_00_00_00_00"


def manifest(folder: Path, step: str) -> dict:
    return json.loads((folder / step / "manifest.json").read_text())


def tree_hashes(*folders: Path) -> dict[str, str]:
    out = {}
    for folder in folders:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


# --- tests, in order ----------------------------------------------------------------------

def test_bad_conf_in_a_backfill_is_refused_naming_the_field(server, partitions,
                                                            tiny_model_dir):
    """Airflow 3.3 validates a backfill's conf against the Params (RunConfig's JSON schema)
    when the backfill is created: the CLI fails with the field's name, nothing is created."""
    bad = {**conf_for(partitions, tiny_model_dir, EXP_A, 1e-3), "learning_rate": 5}
    done = server.cli("backfill", "create", "--dag-id", DAG_ID, "--from-date", DATES[0],
                      "--to-date", DATES[-1], "--dag-run-conf", json.dumps(bad))
    output = done.stdout + done.stderr
    print(f"\nbackfill create with learning_rate 5: exit {done.returncode}\n{output[-1500:]}")
    assert done.returncode != 0, output
    assert "learning_rate" in output, output
    assert server.api("GET", "/backfills", params={"dag_id": DAG_ID}).json()["backfills"] == []
    assert runs(server, "backfill") == []


def test_scheduler_creates_the_latest_interval_run(server):
    """Unpaused with catchup off, the scheduler creates the run of the latest complete @daily
    interval by itself."""
    resp = server.api("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False})
    assert resp.status_code == 200, resp.text
    scheduled = server.wait_for("a scheduled run", lambda: runs(server, "scheduled"),
                                timeout=120, interval=2)
    assert len(scheduled) == 1, scheduled
    run = scheduled[0]
    start = datetime.fromisoformat(run["data_interval_start"])
    end = datetime.fromisoformat(run["data_interval_end"])
    assert end - start == timedelta(days=1) and end.hour == end.minute == 0, run
    # the latest complete interval: it ended before now, and the next one has not
    assert end <= datetime.now(timezone.utc) < end + timedelta(days=1), run
    assert datetime.fromisoformat(run["logical_date"]) == start
    # It trains the default MiniLM on the default data: far too slow here, so stop it.
    resp = server.api("PATCH", f"/dags/{DAG_ID}/dagRuns/{quote(run['dag_run_id'], safe='')}",
                      json={"state": "failed"})
    assert resp.status_code == 200, resp.text


@pytest.fixture(scope="module")
def backfill_a(server, partitions, tiny_model_dir) -> dict:
    return backfill(server, DATES[0], DATES[-1],
                    conf_for(partitions, tiny_model_dir, EXP_A, 1e-3))


def test_backfill_runs_each_date_on_its_own_partition(server, partitions, backfill_a):
    assert sorted(backfill_a) == DATES
    assert {d: r["state"] for d, r in backfill_a.items()} == {d: "success" for d in DATES}
    versions = set()
    for day in DATES:
        folder = run_folder(server, EXP_A, day)
        data = manifest(folder, "data")
        assert data["sources"]["train"]["uri"] == f"{partitions}/{day}/train.tsv"
        # no eval_uri in the conf: each date holds out a split of its own partition
        assert data["eval_source"] == "split", data
        assert sum(s["num_examples"] for s in data["splits"].values()) == ROWS[day], (
            day, data["splits"])
        exported = manifest(folder, "export")
        assert exported["experiment"] == EXP_A
        assert exported["logical_date"].startswith(f"{day}T00:00:00")
        assert json.loads((folder / "config.json").read_text())["train_uri"] == \
            f"{partitions}/{day}/train.tsv"
        assert (Path(exported["version_uri"]) / "_COMPLETE.json").exists()
        versions.add(exported["version_uri"])
    assert len(versions) == len(DATES)


@pytest.fixture(scope="module")
def experiment_b(server, partitions, tiny_model_dir, backfill_a) -> dict:
    folders_a = [run_folder(server, EXP_A, d) for d in DATES]
    versions_a = [Path(manifest(f, "export")["version_uri"]) for f in folders_a]
    before = tree_hashes(*folders_a, *versions_a)
    conf_b = conf_for(partitions, tiny_model_dir, EXP_B, 3e-3)
    # A date that already has a finished run gets no new run unless reprocessing is asked
    # for: Airflow keeps one run per logical date (the folders are per experiment).
    assert dry_run(server, DATES[0], DATES[-1], conf_b) == []
    assert dry_run(server, DATES[0], DATES[-1], conf_b, "completed") == DATES
    # One date is enough to show that exp-b's run of a date exp-a ran gets its own folder
    # (one DAG run fewer than both dates).
    by_date = backfill(server, DATES[-1], DATES[-1], conf_b, "completed")
    after = tree_hashes(*folders_a, *versions_a)
    return {"runs": by_date, "before": before, "after": after}


def test_another_experiment_gets_its_own_folders(server, experiment_b):
    assert {d: r["state"] for d, r in experiment_b["runs"].items()} == {DATES[-1]: "success"}
    folder = run_folder(server, EXP_B, DATES[-1])
    assert json.loads((folder / "config.json").read_text())["learning_rate"] == 3e-3
    assert manifest(folder, "export")["experiment"] == EXP_B
    assert manifest(folder, "tokenize")["reused"] is True  # same data as exp-a's run
    folders = sorted(p.name for p in (Path(server.artifact_root) / "runs" / DAG_ID).iterdir()
                     if p.name.startswith(("exp-a__", "exp-b__")))
    assert folders == sorted([*(run_folder(server, EXP_A, d).name for d in DATES),
                              run_folder(server, EXP_B, DATES[-1]).name]), folders


def test_first_experiment_is_byte_for_byte_unchanged(experiment_b):
    assert experiment_b["before"], "no files hashed"
    assert experiment_b["after"] == experiment_b["before"]


def test_reprocess_completed_rewrites_the_run_and_reuses_the_cache(server, partitions,
                                                                    tiny_model_dir,
                                                                    experiment_b):
    day = DATES[1]
    folder = run_folder(server, EXP_A, day)
    previous_run_id = experiment_b["runs"][day]["dag_run_id"]
    config_mtime = (folder / "config.json").stat().st_mtime
    folders_before = sorted(p.name for p in folder.parent.iterdir())
    by_date = backfill(server, day, day, conf_for(partitions, tiny_model_dir, EXP_A, 1e-3),
                       "completed")
    assert by_date[day]["state"] == "success"
    assert by_date[day]["dag_run_id"] == previous_run_id  # the same Airflow run, cleared
    assert sorted(p.name for p in folder.parent.iterdir()) == folders_before  # no new folder
    assert (folder / "config.json").stat().st_mtime > config_mtime  # rewritten in place
    tokenized = manifest(folder, "tokenize")
    assert tokenized["reused"] is True
    assert manifest(folder, "data")["sources"]["train"]["uri"] == \
        f"{partitions}/{day}/train.tsv"
