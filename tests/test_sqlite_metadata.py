"""The embedded SQLite metadata database waits out another writer for up to 30 s
(bertflow_airflow/sqlite_metadata.py): through Airflow's own engine, in a fresh process."""
import os
import subprocess
import sys

import pytest

from bertflow_airflow import sqlite_metadata

# In a fresh process (Airflow reads its settings at import): another connection holds the
# write lock for HOLD_S, then a write through Airflow's engine; prints the seconds it waited.
WRITE_WHILE_LOCKED = """
import sqlite3, sys, threading, time
from airflow import settings
from sqlalchemy import text

db, hold = sys.argv[1], float(sys.argv[2])
holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)  # committed by a timer
holder.execute("PRAGMA journal_mode=WAL")  # as Airflow's engine sets it on every connect
holder.execute("BEGIN IMMEDIATE")  # the write lock; readers go on
threading.Timer(hold, lambda: holder.execute("COMMIT")).start()
started = time.perf_counter()
with settings.engine.begin() as conn:
    conn.execute(text("CREATE TABLE IF NOT EXISTS probe (x INTEGER)"))
print(round(time.perf_counter() - started, 1))
"""
HOLD_S = 7  # past sqlite3's default 5 s wait


def _write(tmp_path, with_setting: bool) -> subprocess.CompletedProcess:
    db = tmp_path / "airflow.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    env.update({"AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{db}"})
    if with_setting:
        env.update(sqlite_metadata.env(env))
    return subprocess.run([sys.executable, "-c", WRITE_WHILE_LOCKED, str(db), str(HOLD_S)],
                          env=env, capture_output=True, text=True, timeout=120)


def test_a_write_waits_for_the_lock_beyond_sqlites_default(tmp_path):
    done = _write(tmp_path, with_setting=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.split()[-1]) >= HOLD_S - 0.5


def test_without_the_setting_the_same_write_fails_after_5_s(tmp_path):
    done = _write(tmp_path, with_setting=False)
    assert done.returncode != 0 and "database is locked" in done.stderr


@pytest.mark.parametrize("environ, expected", [
    ({}, {sqlite_metadata.SETTING: "bertflow_airflow.sqlite_metadata.CONNECT_ARGS"}),
    ({"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "sqlite:////x/airflow.db"},
     {sqlite_metadata.SETTING: "bertflow_airflow.sqlite_metadata.CONNECT_ARGS"}),
    ({"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql+psycopg2://u@h/db"}, {}),
    ({sqlite_metadata.SETTING: "my_settings.ARGS"}, {}),
])
def test_the_setting_is_for_sqlite_only_and_never_overrides_one(environ, expected):
    assert sqlite_metadata.env(environ) == expected
