"""`make airflow`'s watch over the scheduler (bertflow_airflow/demo.py,
_wait_keeping_the_scheduler), with real processes standing in for airflow standalone and its
scheduler. tests/test_airflow_standalone.py kills a real scheduler and sees the new one
heartbeat; this file covers what that cannot provoke: a scheduler that keeps exiting, and one
that hangs (alive, no heartbeat), with the heartbeat's age given by the test."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from bertflow_airflow import demo, subreaper

# A stand-in for `airflow standalone`: a child whose command line ends in "scheduler" (as
# standalone's does) that exits after 1 s and is never reaped (standalone does not wait for
# its components), then the stand-in itself lives on for `seconds`.
STANDALONE = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)", "scheduler"])
time.sleep(float(sys.argv[1]))
"""
# What starts a scheduler again: one that fails at once, as a broken configuration does.
FAILING = [sys.executable, "-c", "print('replacement scheduler ran'); raise SystemExit(3)",
           "scheduler"]


def test_a_scheduler_that_keeps_exiting_is_started_once_then_left(tmp_path, monkeypatch,
                                                                    capsys):
    monkeypatch.setattr(demo, "SCHEDULER_CHECK_S", 0.2)
    standalone = subprocess.Popen([sys.executable, "-c", STANDALONE, "4"])
    time.sleep(0.5)  # its scheduler child exists before the watch looks for it
    log = tmp_path / "standalone.log"
    rc = demo._wait_keeping_the_scheduler(standalone, dict(os.environ), tmp_path, log,
                                          lambda: None, command=FAILING)
    err = capsys.readouterr().err
    assert rc == 1 and "airflow standalone exited with 0" in err, err
    assert err.count("Airflow's scheduler exited; starting it again") == 1, err
    assert err.count("exited (exit 3), within 120s of its restart; not starting it again") == 1, err
    assert log.read_text() == "replacement scheduler ran\n"  # its output went to the log


# A stand-in for standalone whose scheduler starts a child (as Airflow's starts executor
# workers and a log server) and dies 1.5 s later without ending it; the child's pid goes to
# the file given as argv[2].
LEAVING = """
import subprocess, sys, time
child = "import subprocess, sys, time; open(sys.argv[1], 'w').write(str(subprocess.Popen(" \\
        "[sys.executable, '-c', 'import time; time.sleep(60)']).pid)); time.sleep(1.5)"
subprocess.Popen([sys.executable, "-c", child, sys.argv[2], "scheduler"])
time.sleep(float(sys.argv[1]))
"""


def test_what_an_ended_scheduler_leaves_is_killed(tmp_path, monkeypatch, capsys):
    """A scheduler killed by a signal leaves its executor workers and log server running,
    and the log server keeps the port that the next scheduler's must bind."""
    monkeypatch.setattr(demo, "SCHEDULER_CHECK_S", 0.2)
    pid_file = tmp_path / "child.pid"
    _watch_a_scheduler_that_exits(tmp_path, capsys, LEAVING, "4", str(pid_file))
    assert _ended(int(pid_file.read_text()))


def _watch_a_scheduler_that_exits(tmp_path, capsys, standalone: str, *argv: str,
                                  command: list[str] = FAILING) -> None:
    """The watch over the stand-in `standalone` (python -c) whose scheduler exits once: it is
    started again (`command`), and the watch returns when the stand-in exits."""
    proc = subprocess.Popen([sys.executable, "-c", standalone, *argv])
    time.sleep(0.5)  # its scheduler child exists before the watch looks for it
    rc = demo._wait_keeping_the_scheduler(proc, dict(os.environ), tmp_path,
                                          tmp_path / "standalone.log", lambda: None,
                                          command=command)
    err = capsys.readouterr().err
    assert rc == 1 and err.count("Airflow's scheduler exited; starting it again") == 1, err


# A stand-in for standalone whose scheduler starts a child and dies at once, between two looks
# of the watch (its descendants, as last seen, never held the child): the child is orphaned.
# The child starts a grandchild of its own, killed with it. Their pids go to argv[2].
ORPHANING = """
import os, subprocess, sys, time
grandchild = "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', " \\
             "'import time; time.sleep(60)']); open(sys.argv[1], 'a').write(f' {p.pid}');" \\
             " time.sleep(60)"
scheduler = "import os, subprocess, sys, time; time.sleep(1.5); p = subprocess.Popen(" \\
            "[sys.executable, '-c', sys.argv[2], sys.argv[1]]); " \\
            "open(sys.argv[1], 'w').write(str(p.pid)); os._exit(0)"
subprocess.Popen([sys.executable, "-c", scheduler, sys.argv[2], grandchild, "scheduler"])
time.sleep(float(sys.argv[1]))
"""
# What starts a scheduler again, here: it writes which pids of the file argv[1] still run (not
# zombies) to the log, then fails.
COUNTING = """
import sys, psutil
def runs(pid):
    try:
        return psutil.Process(int(pid)).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
print("running when the replacement started:", [p for p in open(sys.argv[1]).read().split()
                                                if runs(p)])
raise SystemExit(3)
"""


def test_an_orphan_born_after_the_last_look_is_adopted_killed_and_reaped(tmp_path, monkeypatch,
                                                                         capsys):
    """Issue 47: a killed scheduler's LocalExecutor workers outlived it, re-parented to init,
    because they were not among its descendants when the watch last looked. The watch is a
    child subreaper: the orphan comes to it, and it kills and reaps it with its children."""
    monkeypatch.setattr(demo, "SCHEDULER_CHECK_S", 1.0)  # looks at ~1.5 s and ~2.5 s
    pid_file = tmp_path / "orphans.pid"
    _watch_a_scheduler_that_exits(tmp_path, capsys, ORPHANING, "5", str(pid_file), command=[
        sys.executable, "-c", COUNTING, str(pid_file), "scheduler"])
    # Ended before the next scheduler started, not only by the watch's next look.
    assert (tmp_path / "standalone.log").read_text() == \
        "running when the replacement started: []\n"
    orphan, grandchild = (int(pid) for pid in pid_file.read_text().split())
    assert not psutil.pid_exists(orphan), "the orphan was not killed, or not reaped (a zombie)"
    assert _ended(grandchild)
    assert not subreaper.is_subreaper()  # the watch gave the role back


def test_a_running_scheduler_is_left_alone(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo, "SCHEDULER_CHECK_S", 0.2)
    standalone = subprocess.Popen([sys.executable, "-c", STANDALONE.replace(
        "time.sleep(1)", "time.sleep(3)"), "2"])
    time.sleep(0.5)
    rc = demo._wait_keeping_the_scheduler(standalone, dict(os.environ), tmp_path,
                                          tmp_path / "standalone.log", lambda: 1.0,
                                          command=FAILING)
    err = capsys.readouterr().err
    assert rc == 1 and "starting it again" not in err, err
    assert not (tmp_path / "standalone.log").exists()


def test_a_scheduler_without_heartbeat_is_killed_and_started_again(tmp_path, monkeypatch,
                                                                   capsys):
    """After the SQLite race, Airflow's scheduler logged its error and then hung in its
    LocalExecutor's shutdown, alive and silent, for as long as the test ran (18 min). Here a
    stand-in sleeps and the heartbeat is old: it is killed and another started; that one
    makes no heartbeat either, so it is killed and left."""
    monkeypatch.setattr(demo, "SCHEDULER_CHECK_S", 0.2)
    monkeypatch.setattr(demo, "SCHEDULER_STALE_S", 1.0)
    standalone = subprocess.Popen([sys.executable, "-c", STANDALONE.replace(
        "time.sleep(1)", "time.sleep(60)"), "6"])
    time.sleep(0.5)
    (hung,) = psutil.Process(standalone.pid).children()
    silent = [sys.executable, "-c", "import time; time.sleep(60)", "scheduler"]
    sessions: list[int] = []
    rc = demo._wait_keeping_the_scheduler(standalone, dict(os.environ), tmp_path,
                                          tmp_path / "standalone.log", lambda: 300.0,
                                          command=silent, sessions=sessions)
    err = capsys.readouterr().err
    assert rc == 1, err
    assert err.count("made no heartbeat for 300s; killed it; starting it again") == 1, err
    assert err.count("made no heartbeat for 300s; killed it, within 120s of its restart; "
                     "not starting it again") == 1, err
    for pid in (hung.pid, *sessions):
        assert _ended(pid), pid


def _ended(pid: int) -> bool:
    try:
        return demo._exited(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return True
