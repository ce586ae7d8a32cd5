"""Benchmark 5: wall time of `make demo` from a warm install, split by step.

    ./.venv/bin/python benchmarks/e2e_demo.py [--no-warmup]

Runs `make demo` with its own artifact root (a temporary folder, BERTFLOW_ARTIFACT_ROOT; the
demo always uses the project's .airflow/ as AIRFLOW_HOME, which is only read here). The first
run warms the install (metadata DB, first imports) and is not reported unless --no-warmup;
the second is timed. Per-step
times come from Airflow's task_instance table (start/end of each task), cross-checked with the
step manifests' modification times.
"""
from __future__ import annotations

import argparse
import os
import re
import sqlite3
import subprocess
import tempfile
import time
from pathlib import Path

from lib import common


def task_durations(airflow_home: Path, run_key: str) -> list[dict]:
    """Task instances of the dag run whose run folder is `run_key` (read-only query)."""
    db = airflow_home / "airflow.db"
    if not db.exists() or not run_key:
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    run_ids = [r for (r,) in con.execute("SELECT run_id FROM dag_run")
               if re.sub(r"[^A-Za-z0-9._-]+", "_", r) == run_key]
    if not run_ids:
        return []
    rows = con.execute(
        "SELECT task_id, state, start_date, end_date, duration FROM task_instance "
        "WHERE run_id = ? ORDER BY start_date", run_ids[:1]).fetchall()
    return [{"task_id": t, "state": s, "start": a, "end": b, "seconds": d}
            for t, s, a, b, d in rows]


def latest_run(artifact_root: Path) -> Path | None:
    runs = sorted(artifact_root.glob("runs/*/*"), key=lambda p: p.stat().st_mtime)
    return runs[-1] if runs else None


def manifest_times(artifact_root: Path) -> dict[str, float]:
    run = latest_run(artifact_root)
    if run is None:
        return {}
    out = {p.parent.name: p.stat().st_mtime for p in run.glob("*/manifest.json")}
    t0 = (run / "config.json").stat().st_mtime if (run / "config.json").exists() else 0
    return {k: round(v - t0, 1) for k, v in sorted(out.items(), key=lambda kv: kv[1])}


def run_demo(art: Path) -> tuple[float, int, str]:
    env = {**os.environ, "BERTFLOW_ARTIFACT_ROOT": str(art)}
    t0 = time.perf_counter()
    proc = subprocess.run(["make", "demo"], cwd=common.PROJECT_ROOT, env=env,
                          capture_output=True, text=True)
    return time.perf_counter() - t0, proc.returncode, (proc.stdout + proc.stderr)[-3000:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-warmup", action="store_true")
    args = ap.parse_args()
    home = common.PROJECT_ROOT / ".airflow"
    # The demos' artifact folders (about 1.6 GB) go when it ends.
    with tempfile.TemporaryDirectory(prefix="bench-demo-") as tmp:
        work = Path(tmp)
        if not args.no_warmup:
            wall, rc, tail = run_demo(work / "art-warm")
            print(f"warm-up run: {wall:.0f}s (rc {rc})")
        wall, rc, tail = run_demo(work / "art")
        run = latest_run(work / "art")
        tasks = task_durations(home, run.name if run else "")
        marks = manifest_times(work / "art")
    print(f"make demo: {wall:.1f}s wall, exit {rc}")
    for t in tasks:
        sec = f"{t['seconds']:.1f}s" if t["seconds"] is not None else "-"
        print(f"  {t['task_id']:28s} {t['state'] or '-':10s} {sec}")
    if marks:
        print("  manifest written at (s after config.json):", marks)
    if rc != 0:
        print(tail)
    common.write_results("e2e_demo", {"wall_seconds": wall, "exit_code": rc,
                                      "warm_install": not args.no_warmup, "tasks": tasks,
                                      "manifest_seconds_after_start": marks,
                                      "output_tail": tail if rc else ""})


if __name__ == "__main__":
    main()
