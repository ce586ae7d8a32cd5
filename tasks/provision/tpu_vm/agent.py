"""The agent on a Cloud TPU VM: runs the steps the controller asks for, through the run folder.

`python -m tasks.provision.tpu_vm.agent --run-dir gs://...` (started by the VM's startup script,
see tasks/provision/tpu_vm/backend.py) polls `{run}/provision/tpu_vm/` through tasks.io.storage:

- `requests/{step}.json`  `{"id", "step", "command", "env", "timeout_seconds"}`, written by the
  controller. A request whose `status/{id}.json` exists is done; others run one at a time
  (after a VM restart, an interrupted one runs again; train resumes from its checkpoint).
- `logs/{id}/000001.txt`, ... the step's output, one new object per flush (objects are never
  appended to), so the controller streams them in order.
- `status/{id}.json`  `{"id", "exit_code", "tail", "cancelled", "timed_out", "chunks"}`,
  written after the last chunk. The controller writes `{"id", "exit_code": null, "reclaimed",
  "at"}` instead when Cloud TPU took the VM back mid-step, so that no agent runs the request
  again and the next attempt queues the TPU again.
- `{run}/{step}/logs/worker-0.log`  the step's whole log (tasks/provision/worker_logs.py),
  uploaded every LOG_SECONDS and before the status: the agent is its only writer.
- `cancel/{id}.json`  from the controller's stop(): the step's process group is terminated.
- `agent.json`  heartbeat (changes every beat; `running` names the current request).
- `shutdown.json`  from the release step: the agent exits (deleting the VM would stop it
  anyway).

Pure Python and tasks.io.storage: no TensorFlow here, and no credential beyond the VM's own.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from tasks.io import storage
from tasks.config import PROJECT_ROOT
from tasks.io.uris import join_uri
from tasks.errors import BertflowError
from tasks.provision.worker_logs import Spool, attempt_of, log_uris

TAIL_LINES = 30
GRACE_SECONDS = 10.0
LOG_SECONDS = 30.0  # how often the step's whole log is uploaded while it runs


def _say(message: str) -> None:
    print(f"[bertflow-agent] {message}", file=sys.stderr, flush=True)


class Agent:
    def __init__(self, run_dir: str, *, poll_seconds: float = 2.0, flush_seconds: float = 1.0,
                 heartbeat_seconds: float = 15.0, log_seconds: float = LOG_SECONDS):
        self.run_dir = run_dir
        self.folder = join_uri(run_dir, "provision", "tpu_vm")
        self.log_seconds = log_seconds
        self.poll_seconds = poll_seconds
        self.flush_seconds = flush_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self.done: set[str] = set()
        self._beats = 0
        self._last_beat = 0.0

    def uri(self, *parts: str) -> str:
        return join_uri(self.folder, *parts)

    # --- the loop -----------------------------------------------------------------------------
    def serve(self) -> int:
        _say(f"watching {self.folder}")
        while True:
            try:
                self.heartbeat(None)
                if storage.exists(self.uri("shutdown.json")):
                    _say("shutdown requested by the release step; exiting")
                    return 0
                for request in self.pending():
                    self.run(request)
            except (BertflowError, OSError, ValueError) as err:  # storage hiccups: try again
                _say(f"error: {err}; retrying")
            time.sleep(self.poll_seconds)

    def pending(self) -> list[dict]:
        out = []
        for uri in sorted(storage.list_uris(self.uri("requests") + "/")):
            if not uri.endswith(".json"):
                continue
            request = storage.read_json(uri)
            rid = request["id"]
            if rid in self.done:
                continue
            if storage.exists(self.uri("status", f"{rid}.json")):
                self.done.add(rid)
                continue
            out.append(request)
        return out

    def heartbeat(self, running: str | None, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_beat < self.heartbeat_seconds:
            return
        self._beats += 1
        self._last_beat = now
        storage.write_json(self.uri("agent.json"), {
            "host": socket.gethostname(), "pid": os.getpid(), "beat": self._beats,
            "time": time.time(), "running": running})

    # --- one step -----------------------------------------------------------------------------
    def run(self, request: dict) -> None:
        rid = request["id"]
        logs = self.uri("logs", rid)
        # A request interrupted by a VM restart continues its log after the chunks it wrote.
        earlier = sorted(u for u in storage.list_uris(logs + "/") if u.endswith(".txt"))
        chunk = len(earlier)
        # One process per TPU slice: the spec's single role (WorkerSpec.roles).
        uri, copies = log_uris(self.run_dir, request.get("step") or "worker", "worker", 0,
                               attempt_of(request.get("env") or {}))
        spool = Spool(uri, "".join(storage.read_text(u) for u in earlier), copies=copies)
        try:
            self._run(request, rid, logs, chunk, spool)
        finally:
            spool.close()

    def _run(self, request: dict, rid: str, logs: str, chunk: int, spool: Spool) -> None:
        _say(f"running {rid}: {' '.join(request['command'])}")
        self.heartbeat(rid, force=True)
        argv = list(request["command"])
        if argv and argv[0] == "python":
            argv[0] = sys.executable
        env = dict(os.environ)
        env.pop("TF_CONFIG", None)  # the TPU strategy is one process per slice
        env.update(request.get("env") or {})
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
        pending: list[str] = []
        tail: list[str] = []
        lock = threading.Lock()
        try:
            popen = subprocess.Popen(argv, env=env, cwd=PROJECT_ROOT, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, errors="replace", start_new_session=True)
        except OSError as err:
            spool.line(f"cannot start {argv[0]}: {err}")
            self.finish(rid, 127, [f"cannot start {argv[0]}: {err}"], chunk, spool=spool)
            return

        def pump() -> None:
            for line in popen.stdout:
                line = line.rstrip("\n")
                with lock:
                    pending.append(line)
                    tail.append(line)
                    del tail[:-TAIL_LINES]

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timeout = float(request.get("timeout_seconds") or 0)
        deadline = time.monotonic() + timeout if timeout else None
        cancelled = timed_out = False
        next_check = 0.0
        next_upload = time.monotonic() + self.log_seconds
        exited_at = None
        while popen.poll() is None or reader.is_alive():
            reader.join(timeout=self.flush_seconds)
            if popen.poll() is not None:
                # A child of the step that keeps its stdout open must not hold the status.
                exited_at = exited_at or time.monotonic()
                if time.monotonic() - exited_at > GRACE_SECONDS:
                    break
            chunk = self._flush(logs, chunk, pending, lock, spool)
            now = time.monotonic()
            if now >= next_upload:
                next_upload = now + self.log_seconds
                try:
                    spool.flush()
                except (BertflowError, OSError) as err:
                    _say(f"error keeping the step's log: {err}; continuing")
            if popen.poll() is None and now >= next_check:
                next_check = now + self.poll_seconds
                try:
                    self.heartbeat(rid)
                    if not cancelled and storage.exists(self.uri("cancel", f"{rid}.json")):
                        _say(f"cancel requested for {rid}")
                        cancelled = True
                        _terminate(popen)
                except (BertflowError, OSError) as err:
                    _say(f"error: {err}; continuing")
                if deadline is not None and now > deadline and not timed_out:
                    _say(f"{rid} ran past its timeout; stopping it")
                    timed_out = True
                    _terminate(popen)
        chunk = self._flush(logs, chunk, pending, lock, spool)
        self.finish(rid, popen.returncode, tail, chunk, cancelled=cancelled,
                    timed_out=timed_out, spool=spool)

    def _flush(self, logs: str, chunk: int, pending: list[str], lock: threading.Lock,
               spool: Spool) -> int:
        with lock:
            lines = list(pending)
            pending.clear()
        if not lines:
            return chunk
        chunk += 1
        text = "\n".join(lines) + "\n"
        storage.write_text(join_uri(logs, f"{chunk:06d}.txt"), text)
        spool.write(text)
        return chunk

    def finish(self, rid: str, code: int, tail: list[str], chunks: int, *,
               cancelled: bool = False, timed_out: bool = False,
               spool: Spool | None = None) -> None:
        if spool is not None:  # the whole log first: a status means the log is complete
            spool.flush(force=True)
        storage.write_json(self.uri("status", f"{rid}.json"), {
            "id": rid, "exit_code": code, "tail": tail[-TAIL_LINES:], "cancelled": cancelled,
            "timed_out": timed_out, "chunks": chunks})
        self.done.add(rid)
        self.heartbeat(None, force=True)
        _say(f"{rid} finished with exit code {code}")


def _terminate(popen: subprocess.Popen) -> None:
    """SIGTERM to the step's process group, SIGKILL after a grace period (in a thread, so
    the log keeps flowing meanwhile)."""
    def kill() -> None:
        for sig, wait in ((signal.SIGTERM, GRACE_SECONDS), (signal.SIGKILL, None)):
            try:
                os.killpg(popen.pid, sig)
            except (ProcessLookupError, PermissionError):
                return
            if wait is None:
                return
            try:
                popen.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    threading.Thread(target=kill, daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.provision.tpu_vm.agent",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", required=True, help="run folder URI (gs://...)")
    parser.add_argument("--poll-seconds", type=float, default=2.0)
    parser.add_argument("--flush-seconds", type=float, default=1.0)
    parser.add_argument("--heartbeat-seconds", type=float, default=15.0)
    parser.add_argument("--log-seconds", type=float, default=LOG_SECONDS)
    args = parser.parse_args(argv)
    agent = Agent(args.run_dir, poll_seconds=args.poll_seconds,
                  flush_seconds=args.flush_seconds, heartbeat_seconds=args.heartbeat_seconds,
                  log_seconds=args.log_seconds)
    try:
        return agent.serve()
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
