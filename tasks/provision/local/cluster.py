"""Local backend: run a WorkerSpec as processes on this machine, on loopback ports.

The controller (an Airflow task, a test, the CLI) calls `LocalCluster(spec).run()`: it starts
one process per TF_CONFIG role, streams their output with a `[role:index]` prefix, fails fast
when any process fails, and always leaves no process behind (each process leads its own
process group, so whatever it spawned goes with it).
"""
from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import psutil

from tasks.io import storage
from tasks.config import PROJECT_ROOT
from tasks.errors import WorkerError
from tasks.provision.attempts import WorkerLost, outcome_of_exit
from tasks.provision.spec import WorkerSpec, process_env, run_hash

if TYPE_CHECKING:
    from tasks.provision.local.warm_start import WarmProcess

TAIL_LINES = 30
# Messages with which TensorFlow's gRPC server reports a port taken between our pick and its
# bind: the only failure worth retrying with fresh ports.
_PORT_TAKEN = ("Address already in use", "Failed to add port", "Could not start gRPC server")


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports. All sockets stay bound until every port is picked, so the
    kernel cannot hand out the same port twice; another program may still grab one before the
    workers bind it, which `LocalCluster` handles by retrying."""
    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
        return ports


def tf_config(addresses: dict[str, list[str]], role: str, index: int) -> str:
    return json.dumps({"cluster": addresses, "task": {"type": role, "index": index}})


def local_tmp_root(run_uri: str) -> Path:
    """Per-run scratch folder for worker temp files (non-chief workers write there); the
    release step removes it."""
    return Path(tempfile.gettempdir()) / "bertflow-workers" / run_hash(run_uri, 16)


def process_started(pid: int) -> float | None:
    """Start time of a process (psutil's create_time: seconds since the epoch, the same value
    for the same process every time it is asked), to tell a recorded pid from a reused one."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


@dataclass
class _Proc:
    role: str
    index: int
    popen: subprocess.Popen | WarmProcess
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    reader: threading.Thread | None = None
    # When its output ended (it exited; stamped by its reader thread, which a busy controller
    # loop does not delay), and when the controller first saw its exit code.
    ended_at: float | None = None
    seen_at: float | None = None

    @property
    def name(self) -> str:
        return f"{self.role}:{self.index}"


class _PortTaken(Exception):
    pass


class LocalCluster:
    """Runs one WorkerSpec locally. `run()` blocks; `stop()` may be called from any thread."""

    def __init__(self, spec: WorkerSpec, log: Callable[[str], None] = print, *,
                 grace_seconds: float = 10.0, record_uri: str | None = None,
                 tmp_root: Path | None = None, port_attempts: int = 3,
                 extra_env: dict[str, str] | None = None, logs=None,
                 settle_seconds: float = 3.0):
        self.spec = spec
        # worker_logs.StepLogs: every process's output kept in the run folder.
        self.logs = logs
        # Secrets (e.g. credentials.worker_env): passed at process start only, never part
        # of the spec, which is written to the provision manifest and logged.
        self._extra_env = dict(extra_env or {})
        self.log = log
        self.grace_seconds = grace_seconds
        self.record_uri = record_uri
        self.tmp_root = Path(tmp_root) if tmp_root else None
        self.port_attempts = port_attempts
        # After the first failure, how long to wait for the others to end before naming the
        # root cause (_fail_root_cause).
        self.settle_seconds = settle_seconds
        self._procs: list[_Proc] = []
        # Guards _procs against stop() from another thread. Re-entrant because stop() may also
        # run in a signal handler (Airflow's on_kill on SIGTERM) on the thread holding it.
        self._lock = threading.RLock()
        self._stopped = threading.Event()
        # One reader thread per process calls `log`: print writes a line and its newline
        # separately, so unserialised calls interleave two workers' lines into one.
        self._log_lock = threading.Lock()
        self.running_at: float | None = None

    # --- public ---------------------------------------------------------------------------
    def run(self) -> None:
        try:
            for attempt in range(1, self.port_attempts + 1):
                try:
                    self._run_once()
                    return
                except _PortTaken as err:
                    if attempt == self.port_attempts:
                        raise WorkerError(f"could not bind worker ports after {attempt} "
                                          f"attempts: {err}") from None
                    self.log(f"[cluster] port taken ({err}); retrying with new ports")
        finally:
            if self.logs is not None:
                self.logs.close()

    def stop(self) -> None:
        """Stop every process (e.g. from an Airflow task's on_kill); run() then raises."""
        self._stopped.set()
        self._shutdown()
        if self.logs is not None:
            self.logs.flush()

    # --- internals ---------------------------------------------------------------------------
    def _run_once(self) -> None:
        try:
            self._start()
            self._watch()
        finally:
            self._shutdown()

    def _start(self) -> None:
        roles = self.spec.roles
        addresses: dict[str, list[str]] = {}
        if self.spec.cluster:
            ports = iter(free_ports(len(roles)))
            for role, _ in roles:
                addresses.setdefault(role, []).append(f"127.0.0.1:{next(ports)}")
        # Imported here: `python -m tasks.provision.local.warm_start` must be its first import.
        from tasks.provision.local import warm_start

        argv = list(self.spec.command)
        if argv and argv[0] == "python":
            argv[0] = sys.executable
        with self._lock:
            self._procs = []
            for role, index in roles:
                if self._stopped.is_set():
                    break
                env = self._env(role, index, addresses)
                # Forked from a warm server when one serves ($BERTFLOW_WARM_SOCKET), else a
                # fresh interpreter: the same process either way (tasks/provision/local/warm_start.py).
                popen = warm_start.spawn(argv, env, PROJECT_ROOT, self.log) or subprocess.Popen(
                    argv, env=env, cwd=PROJECT_ROOT, stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                    errors="replace", start_new_session=True)
                proc = _Proc(role, index, popen)
                proc.reader = threading.Thread(target=self._pump, args=(proc,), daemon=True)
                proc.reader.start()
                self._procs.append(proc)
        self.running_at = time.time()  # all started: the attempt's running_at (attempts.py)
        self._record()

    def _env(self, role: str, index: int, addresses: dict[str, list[str]]) -> dict[str, str]:
        env = process_env(os.environ, self.spec.env, self._extra_env)
        if addresses:
            env["TF_CONFIG"] = tf_config(addresses, role, index)
        if self.tmp_root is not None:
            tmp = self.tmp_root / f"{role}-{index}"
            tmp.mkdir(parents=True, exist_ok=True)
            env["TMPDIR"] = str(tmp)
        return env

    def _pump(self, proc: _Proc) -> None:
        for line in proc.popen.stdout:
            line = line.rstrip("\n")
            proc.tail.append(line)
            if self.logs is not None:
                self.logs.line(proc.role, proc.index, line)
            with self._log_lock:
                self.log(f"[{proc.name}] {line}")
        proc.ended_at = time.monotonic()

    def _watch(self) -> None:
        if self._stopped.is_set():  # stop() came before or during start
            raise WorkerError("workers stopped before finishing")
        main = next(p for p in self._procs if (p.role, p.index) == self.spec.main_role)
        while True:
            if self._stopped.is_set():
                raise WorkerError("workers stopped before finishing")
            if self._failed():
                self._fail_root_cause()
            if main.popen.poll() == 0:
                self._wait_for_peers(main)
                return
            self._stopped.wait(0.1)

    def _wait_for_peers(self, main: _Proc) -> None:
        """After the main process succeeded, give the other processes that run the program to
        completion (MWMS workers, also beside a chief as on Vertex AI) a grace period; servers
        (ps, PS-strategy workers) never exit on their own and are stopped by _shutdown."""
        completing = {main.role}
        if self.spec.strategy == "multi_worker_mirrored":
            completing.add("worker")  # beside a chief too: Vertex AI makes worker 0 its chief
        finishing = [p for p in self._procs if p is not main and p.role in completing]
        deadline = time.monotonic() + self.grace_seconds
        while time.monotonic() < deadline and any(p.popen.poll() is None for p in finishing):
            time.sleep(0.1)
        if self._failed():
            self._fail_root_cause()

    def _failed(self) -> list[_Proc]:
        """Processes that exited non-zero, each stamped when first seen so."""
        now = time.monotonic()
        failed = []
        for proc in self._procs:
            if proc.popen.poll():
                if proc.seen_at is None:
                    proc.seen_at = now
                failed.append(proc)
        return failed

    def _fail_root_cause(self) -> None:
        """Raise for the process whose end caused the others': one killed by a signal (SIGKILL
        from the OOM killer or a person, a segfault) before any that exited with an error, since
        its peers' collectives then fail too, possibly a moment sooner than its own exit is
        reported (a warm-started process's status comes over a socket); else the one whose
        output ended first. Waits up to `settle_seconds` for the rest to end, so that a death
        the poll has not seen yet is not missed."""
        deadline = time.monotonic() + self.settle_seconds
        while True:
            failed = self._failed()
            if any(_by_signal(p.popen.returncode) for p in failed) or \
                    time.monotonic() >= deadline or \
                    all(p.popen.poll() is not None for p in self._procs):
                break
            time.sleep(0.05)
        for proc in failed:
            proc.reader.join(timeout=5)  # its last lines (the error) and ended_at
        for proc in failed:  # a lost race for a port, wherever it showed: retried
            self._check_port_taken(proc)
        cause = min(failed, key=lambda p: (not _by_signal(p.popen.returncode),
                                           p.ended_at or p.seen_at, p.seen_at))
        others = [p for p in failed if p is not cause]
        self._fail(cause, cause.popen.returncode, others)

    def _check_port_taken(self, proc: _Proc) -> None:
        if self.spec.cluster and any(marker in line for line in proc.tail
                                     for marker in _PORT_TAKEN):
            raise _PortTaken(f"{proc.name}: {proc.tail[-1]}")

    def _fail(self, proc: _Proc, code: int, others: list[_Proc] = ()) -> None:
        proc.reader.join(timeout=5)  # let the last lines (the error) arrive first
        text = "\n".join(proc.tail)
        self._check_port_taken(proc)
        last = next((ln for ln in reversed(proc.tail) if ln.strip()), "(no output)")
        after = "".join(f"; then {p.name} exited with code {p.popen.returncode}"
                        for p in others)
        raise _exit_error(code)(f"{proc.name} exited with code {code}: {last}{after}\n--- "
                                f"last output of {proc.name} ---\n{text}")

    def _shutdown(self) -> None:
        with self._lock:
            procs = list(self._procs)
        live = [p for p in procs if p.popen.poll() is None]
        for proc in procs:
            # The whole group, also for a leader that already exited: its children may remain.
            _signal_group(proc.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_seconds
        for proc in live:
            try:
                proc.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in procs:
            _signal_group(proc.popen.pid, signal.SIGKILL)
            # With a timeout, Popen.wait never blocks on its internal lock, so this is safe
            # when stop() runs in a signal handler that interrupted this very loop.
            try:
                proc.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.log(f"[cluster] {proc.name} (pid {proc.popen.pid}) survived SIGKILL; "
                         "the release step will retry")
            if proc.reader is not None:
                proc.reader.join(timeout=5)

    def _record(self) -> None:
        """Write the pids where the release (teardown) task finds them, in case this
        controller dies without cleaning up (e.g. its machine's Airflow worker was killed)."""
        if self.record_uri is None:
            return
        storage.write_json(self.record_uri, {"pids": [
            {"pid": p.popen.pid, "role": p.role, "index": p.index,
             "started": process_started(p.popen.pid)} for p in self._procs]})


def _by_signal(code: int | None) -> bool:
    """Killed by a signal, not as a consequence of a peer's failure. SIGABRT is left out:
    TensorFlow aborts a process whose collective or coordination service failed (a fatal
    check), which is what a peer's death does to it."""
    return code is not None and code < 0 and code != -signal.SIGABRT


def _exit_error(code: int) -> type[WorkerError]:
    """75: preempted and saved; killed by SIGKILL (no notice): lost; else a failure."""
    return WorkerLost if code == -signal.SIGKILL else outcome_of_exit(code)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_recorded(record: dict) -> list[int]:
    """Kill the process groups of recorded pids that are still the same processes."""
    killed = []
    for entry in record.get("pids", []):
        pid = entry["pid"]
        started = process_started(pid)
        if started is None or started != entry.get("started"):
            continue  # gone, or the pid now belongs to another process
        _signal_group(pid, signal.SIGKILL)
        killed.append(pid)
    return killed
