"""Every worker's log, kept in the run folder as `{run}/{step}/logs/{role}-{index}.log`.

Every provisioning attempt of a step (tasks/provision/attempts.py: BERTFLOW_ATTEMPT in the
workers' environment) also keeps its own file, `{role}-{index}.attempt-{n}.log`, which no
later attempt overwrites; `{role}-{index}.log` is the newest attempt's (the same text).
`attempt_logs(run_uri, step)` lists them by worker and attempt, for the run page.

Pods, Vertex AI replicas and TPU VMs are deleted when a step ends, and a cluster without a
log agent keeps nothing of them. Each log file has exactly one writer, the process that sees
the worker's output:

| backend    | writer                                                                   |
|------------|--------------------------------------------------------------------------|
| local      | the controller (`LocalCluster` reads every process's output)             |
| kubernetes | the controller (its per-pod log streams), flushed before it deletes the  |
|            | step's objects; `release` reads the full log of pods a dead controller   |
|            | left behind, before deleting them                                        |
| vertex_ai  | the worker itself: the container runs `python -m                         |
|            | tasks.provision.worker_logs -- <command>`, which tees the step's output  |
|            | (still printed, for Cloud Logging) into the file; the controller cannot  |
|            | read Cloud Logging                                                       |
| tpu_vm     | the agent on the VM (it runs the process); `release` assembles the file  |
|            | from the agent's chunks for a step the agent never finished              |

A writer keeps the log in a local spool file and uploads it whole (objects are never
appended to) every FLUSH_SECONDS, when the worker ends, and when it is stopped (SIGTERM,
Airflow's on_kill). A retried Airflow task continues the step's attempt numbering, so it
writes new attempt files; only the newest-attempt copy is rewritten. A Vertex AI replica
restarted in place keeps its attempt number: its writer continues the attempt's file
(earlier_run) rather than overwriting it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Callable

from tasks.io.uris import join_uri
from tasks.errors import BertflowError
from tasks.provision.attempts import ATTEMPT_ENV

FLUSH_SECONDS = 30.0
# Vertex AI's worker pools, as CLUSTER_SPEC names them, to TF_CONFIG's task types.
_POOL_ROLES = {"workerpool0": "chief", "workerpool1": "worker", "workerpool2": "ps",
               "workerpool3": "evaluator"}


def logs_uri(run_uri: str, step: str) -> str:
    return join_uri(run_uri, step, "logs")


def log_uri(run_uri: str, step: str, role: str, index: int, attempt: int | None = None) -> str:
    """The worker's log: the newest attempt's, or attempt `attempt`'s own."""
    name = f"{role}-{index}.attempt-{attempt}.log" if attempt else f"{role}-{index}.log"
    return join_uri(logs_uri(run_uri, step), name)


def attempt_of(env) -> int | None:
    """The provisioning attempt a worker runs in (BERTFLOW_ATTEMPT), None outside one."""
    try:
        return int(env.get(ATTEMPT_ENV) or 0) or None
    except (TypeError, ValueError):
        return None


def log_uris(run_uri: str, step: str, role: str, index: int,
             attempt: int | None) -> tuple[str, list[str]]:
    """(the file a writer keeps, copies of it): the attempt's own file and the newest-attempt
    copy inside an attempt; the plain file alone outside one."""
    latest = log_uri(run_uri, step, role, index)
    if not attempt:
        return latest, []
    return log_uri(run_uri, step, role, index, attempt), [latest]


_ATTEMPT_FILE = re.compile(r"^(?P<role>[a-z]+)-(?P<index>\d+)\.attempt-(?P<attempt>\d+)\.log$")


def attempt_logs(run_uri: str, step: str) -> dict[str, dict[int, str]]:
    """{"role-index": {attempt: uri}} of a step's kept attempt logs, attempts in order."""
    from tasks.io import storage

    found: dict[str, dict[int, str]] = {}
    for uri in storage.list_uris(logs_uri(run_uri, step) + "/"):
        match = _ATTEMPT_FILE.match(uri.rsplit("/", 1)[-1])
        if match:
            found.setdefault(f"{match['role']}-{match['index']}", {})[
                int(match["attempt"])] = uri
    return {name: dict(sorted(by.items())) for name, by in sorted(found.items())}


class Spool:
    """One worker's log as a local file, uploaded whole to `uri` (and to every URI in
    `copies`) on flush."""

    def __init__(self, uri: str, text: str = "", copies: list[str] = ()):
        self.uri = uri
        self.copies = list(copies)
        handle, self.path = tempfile.mkstemp(prefix="bertflow-log-", suffix=".log")
        self._file = os.fdopen(handle, "w", encoding="utf-8", errors="replace")
        # Re-entrant: a controller's stop() may run in a signal handler (Airflow's on_kill)
        # on the very thread that is inside a write or a flush.
        self._lock = threading.RLock()
        # One upload at a time, each of the newest text: an older copy never lands last.
        self._upload_lock = threading.RLock()
        self._dirty = False
        if text:
            self.write(text)

    def write(self, text: str) -> None:
        with self._lock:
            if self._file.closed:
                return  # a late line after the last upload
            self._file.write(text)
            self._dirty = True

    def line(self, line: str) -> None:
        self.write(line + "\n")

    def flush(self, force: bool = False) -> None:
        """Upload the log if it changed since the last upload (or `force`)."""
        from tasks.io import storage

        with self._upload_lock:
            with self._lock:
                if not (self._dirty or force) or self._file.closed:
                    return
                self._file.flush()
                uploads = []
                for uri in (self.uri, *self.copies):
                    handle, copy = tempfile.mkstemp(prefix="bertflow-log-", suffix=".upload")
                    os.close(handle)
                    shutil.copyfile(self.path, copy)
                    uploads.append((copy, uri))
                self._dirty = False
            try:
                for copy, uri in uploads:
                    storage.upload_file(copy, uri)  # moves the copy
            except BaseException:
                self._dirty = True
                raise
            finally:
                for copy, _ in uploads:
                    if os.path.exists(copy):
                        os.unlink(copy)

    def close(self) -> None:
        with self._upload_lock, self._lock:
            if not self._file.closed:
                self._file.close()
                os.unlink(self.path)


class StepLogs:
    """The log files of one step's workers, written by a controller that sees their output.
    `line(role, index, text)` from any thread; uploads every `flush_seconds` in a thread, on
    `flush()` and on `close()`. Upload errors go to `log` (a lost upload must not fail the
    step); the next flush tries again."""

    def __init__(self, run_uri: str, step: str, log: Callable[[str], None] = print, *,
                 flush_seconds: float = FLUSH_SECONDS, attempt: int | None = None):
        self.run_uri, self.step, self.log = run_uri, step or "worker", log
        self.flush_seconds = flush_seconds
        self.attempt = attempt  # the provisioning attempt: its own files besides the newest
        self._spools: dict[tuple[str, int], Spool] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._timer: threading.Thread | None = None
        self._warned = False

    def uri(self, role: str, index: int) -> str:
        return log_uris(self.run_uri, self.step, role, index, self.attempt)[0]

    def open(self, role: str, index: int) -> Spool:
        with self._lock:
            spool = self._spools.get((role, index))
            if spool is None:
                uri, copies = log_uris(self.run_uri, self.step, role, index, self.attempt)
                spool = self._spools[(role, index)] = Spool(uri, copies=copies)
            if self._timer is None and not self._closed.is_set():
                self._timer = threading.Thread(target=self._tick, daemon=True,
                                               name=f"logs-{self.step}")
                self._timer.start()
            return spool

    def line(self, role: str, index: int, text: str) -> None:
        if not self._closed.is_set():  # a late line after close() is dropped
            self.open(role, index).line(text)

    def flush(self) -> None:
        with self._lock:
            spools = list(self._spools.values())
        for spool in spools:
            try:
                spool.flush()
            except (BertflowError, OSError) as err:
                if not self._warned:
                    self._warned = True
                    self.log(f"[logs] could not keep {spool.uri}: {err} (retrying at the "
                             f"next flush)")

    def close(self) -> None:
        """Last upload of every file; later lines are dropped."""
        if self._closed.is_set():
            return
        self._closed.set()
        self.flush()
        with self._lock:
            spools = list(self._spools.values())
        for spool in spools:
            spool.close()

    def _tick(self) -> None:
        while not self._closed.wait(self.flush_seconds):
            self.flush()


# --- the worker-side writer (Vertex AI) ---------------------------------------------------
def wrap(command: list[str], run_uri: str, step: str) -> list[str]:
    """`command` run under the worker-side writer (for backends whose controller cannot
    read the workers' output)."""
    return ["python", "-m", "tasks.provision.worker_logs", "--run-dir", run_uri,
            "--step", step or "worker", "--", *command]


def worker_identity(environ=os.environ) -> tuple[str, int]:
    """(role, index) of this process: TF_CONFIG's task (Vertex AI writes it for every
    replica), else Vertex AI's CLUSTER_SPEC (workerpoolN), else ("worker", 0)."""
    for name in ("TF_CONFIG", "CLUSTER_SPEC"):
        try:
            task = json.loads(environ.get(name) or "{}").get("task") or {}
        except ValueError:
            continue
        kind = task.get("type")
        if kind:
            return _POOL_ROLES.get(kind, kind), int(task.get("index") or 0)
    return "worker", 0


RESTARTED = ("[bertflow] --- the replica restarted in place (same attempt); the log of its "
             "earlier run is above ---")


def earlier_run(uri: str) -> str:
    """What an earlier run of this replica in the same attempt kept in `uri` ('' if none).

    Vertex AI restarts a replica that exits non-zero in place, with the same command and
    environment, so the same BERTFLOW_ATTEMPT (and restarts the whole job, every replica,
    under `restart_job_on_worker_restart`). Its writer would start an empty spool and
    overwrite the attempt's file with the restart's output alone; it continues the file
    instead, after a RESTARTED line."""
    from tasks.io import storage

    try:
        text = storage.read_text(uri) if storage.exists(uri) else ""
    except (BertflowError, OSError):
        return ""  # unreadable: the restart's own log is still kept
    if not text:
        return ""
    return (text if text.endswith("\n") else text + "\n") + RESTARTED + "\n"


def tee(command: list[str], uri: str, *, flush_seconds: float = FLUSH_SECONDS,
        out=None, copies: list[str] = (), earlier: str = "") -> int:
    """Run `command`, print its output (stdout and stderr, merged) and keep it in `uri`,
    after `earlier` (an earlier run's log of the same attempt); SIGTERM and SIGINT go to
    the command, whose exit the log waits for. Returns its exit code (128 + signal when
    killed by one)."""
    out = out or sys.stdout
    argv = list(command)
    if argv and argv[0] == "python":
        argv[0] = sys.executable
    spool = Spool(uri, text=earlier, copies=copies)
    state: dict = {"popen": None, "signal": None}

    def forward(signum, _frame):  # takes no lock: it may interrupt a write to the spool
        state["signal"] = signum
        if state["popen"] is not None and state["popen"].poll() is None:
            state["popen"].send_signal(signum)

    # Before the worker starts: a signal that comes while it starts is passed on too.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    try:
        popen = state["popen"] = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, errors="replace")
    except OSError as err:
        spool.line(f"cannot start {argv[0]}: {err}")
        spool.flush()
        spool.close()
        return 127
    if state["signal"] is not None:
        popen.send_signal(state["signal"])
    done = threading.Event()

    def periodic() -> None:
        while not done.wait(flush_seconds):
            try:
                spool.flush()
            except (BertflowError, OSError) as err:
                print(f"[bertflow] could not keep {uri}: {err}", file=sys.stderr, flush=True)

    threading.Thread(target=periodic, daemon=True).start()
    try:
        for line in popen.stdout:
            out.write(line)
            out.flush()
            spool.write(line)
        code = popen.wait()
        if state["signal"] is not None:
            spool.line(f"[bertflow] received signal {state['signal']}; passed to the worker, "
                       f"which exited with code {code}")
    finally:
        done.set()
        spool.flush(force=True)
        spool.close()
    return code if code >= 0 else 128 - code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tasks.provision.worker_logs",
        description="run a worker command and keep its output in the run folder")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--step", required=True)
    parser.add_argument("--flush-seconds", type=float, default=FLUSH_SECONDS)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    from tasks.runs.runlayout import load_run

    try:
        load_run(args.run_dir)  # points storage at the run's connections
    except BertflowError as err:  # the step itself will say so; its output is still shown
        print(f"[bertflow] cannot read the run folder for its log: {err}", file=sys.stderr)
    role, index = worker_identity()
    attempt = attempt_of(os.environ)
    uri, copies = log_uris(args.run_dir, args.step, role, index, attempt)
    # Within an attempt, a file already there is this replica's own, from before Vertex AI
    # restarted it in place: keep it. (Outside an attempt a new run cannot be told from a
    # restart; the one file is rewritten.)
    return tee(command, uri, flush_seconds=args.flush_seconds, copies=copies,
               earlier=earlier_run(uri) if attempt else "")


if __name__ == "__main__":
    sys.exit(main())
