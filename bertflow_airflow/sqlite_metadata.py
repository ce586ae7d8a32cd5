"""How long Airflow waits for the embedded SQLite metadata database's write lock, for the
Airflow that `make demo` and `make airflow` start ([database] sql_alchemy_connect_args, an
import path to a dict of the driver's connect arguments).

SQLite has one writer at a time; Python's sqlite3 waits 5 s for the lock, then fails the
statement ("database is locked"). On a loaded 2-core machine, an approval answered through
the REST API failed with HTTP 500 after 5.0 s, as the api-server's audit-log insert waited on
another writer (tests/test_airflow_standalone.py, one full-suite run of three, 2026-12-05).
Waiting up to 30 s, the example value of Airflow's documentation for this setting, turns
that failure into a slower answer.
"""
from __future__ import annotations

from collections.abc import Mapping

CONNECT_ARGS = {"timeout": 30}  # sqlite3.connect's timeout, seconds
SETTING = "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS"


def env(environ: Mapping[str, str]) -> dict[str, str]:
    """The setting for an Airflow whose environment is `environ`, when its metadata database
    is the default SQLite one; nothing when another database is configured (other drivers
    take other arguments) or the setting is already there."""
    conn = environ.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "")
    if SETTING in environ or (conn and not conn.startswith("sqlite")):
        return {}
    return {SETTING: f"{__name__}.CONNECT_ARGS"}
