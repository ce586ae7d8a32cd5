"""Streaming one pod's log into the step controller's log (tasks/provision/kubernetes/
backend.py's JobController), reopened across cut streams without repeating lines."""
from __future__ import annotations

import collections
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Protocol

import tenacity

from tasks.config import RunConfig
from tasks.provision.kubernetes import render
from tasks.provision.local.cluster import TAIL_LINES
from tasks.provision.worker_logs import StepLogs


class LogController(Protocol):
    """What a PodLog uses of its controller (backend.py's JobController): declared here, as
    backend.py imports this module and an import back would close a circle."""

    api: Any  # backend.py's _Api; `.core` is the kubernetes CoreV1Api
    cfg: RunConfig
    finished: threading.Event
    logs: StepLogs
    log: Callable[[str], None]


class PodLog:
    """Streams one pod's log into the controller's log with its `[role:index]` prefix.

    The API server may end a follow stream while the pod still runs (kubelet and proxy
    timeouts on long steps, an API server restart). The stream asks for timestamps, so a
    reopened one starts a little before the last line seen and skips what was delivered."""

    REOPEN_MARGIN = 60  # seconds asked for before the last line: clock skew to the server
    OPEN_ATTEMPTS = 5  # consecutive failures to reopen before giving up on the log
    REOPEN_PAUSE = 1.0  # seconds between two opens at least: a server that cuts at once

    def __init__(self, controller: LogController, pod_name: str, task: str):
        self.pod_name = pod_name
        self.task = task
        self.tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
        self._controller = controller
        self._resp = None
        self._closed = threading.Event()
        self._last = LogPosition()
        self.thread = threading.Thread(target=self._pump, daemon=True,
                                       name=f"log-{pod_name}")
        self.thread.start()

    def _pump(self) -> None:
        c = self._controller
        final, reopened = False, 0
        while not self._closed.is_set():
            opened = time.monotonic()
            try:
                resp = self._open_with_retries()
            except Exception as err:  # noqa: BLE001 (the pod may be gone already)
                if not c.finished.is_set() and not self._closed.is_set():
                    c.log(f"[cluster] no log for {self.task} (pod {self.pod_name}): "
                          f"{str(err).splitlines()[0][:200]}")
                return
            self._read(resp)
            if final or self._closed.is_set() or c.finished.is_set():
                return
            # The stream ended: a finished pod's log is complete after one more read (lines
            # written between the cut and the pod's end); a running pod's is reopened.
            final = self._pod_finished()
            if final is None:
                return
            if not final:
                reopened += 1
                if reopened == 1:  # once: a proxy's idle timeout can cut every few minutes
                    c.log(f"[cluster] log stream of {self.task} (pod {self.pod_name}) ended "
                          f"while the pod runs; reopening it whenever that happens")
                self._closed.wait(max(0.0, opened + self.REOPEN_PAUSE - time.monotonic()))

    def _open_with_retries(self):
        """Open the stream; a failed reopen is retried (2, 4, 8, 10 s apart) up to
        OPEN_ATTEMPTS times in a row, a first open never (the pod has no log yet or is gone).
        The waits end early when the log is closed."""
        retrying = tenacity.Retrying(
            stop=(tenacity.stop_after_attempt(self.OPEN_ATTEMPTS)
                  | (lambda state: self._last.us is None or self._closed.is_set())),
            wait=tenacity.wait_exponential(multiplier=2, max=10),
            sleep=self._closed.wait, reraise=True)
        return retrying(self._open)

    def _open(self):
        c = self._controller
        extra = {}
        if self._last.us is not None:
            self._last.rewind()
            behind = time.time() - self._last.us / 1e6
            extra["since_seconds"] = max(1, int(behind) + 1 + self.REOPEN_MARGIN)
        # Infinite read timeout: a quiet worker (a long step) is not a dead stream. The
        # connect timeout still catches an unreachable API server.
        resp = c.api.core.read_namespaced_pod_log(
            self.pod_name, c.cfg.k8s_namespace, container=render.CONTAINER, follow=True,
            timestamps=True, _preload_content=False, _request_timeout=(30, None), **extra)
        self._resp = resp
        return resp

    def _read(self, resp) -> None:
        buffer = b""
        try:
            for chunk in resp.stream(4096, decode_content=True):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    self._take(line)
            if buffer:
                self._take(buffer)
        except Exception:  # noqa: BLE001 (the connection dropped: pod deleted, server gone)
            pass
        finally:
            resp.release_conn()

    def _pod_finished(self) -> bool | None:
        """True if the pod ended, False if it runs, None if it is gone or unreadable."""
        c = self._controller
        try:
            pod = c.api.core.read_namespaced_pod(self.pod_name, c.cfg.k8s_namespace)
        except Exception:  # noqa: BLE001 (deleted: its log went with it)
            return None
        return (pod.status.phase if pod.status else None) in ("Succeeded", "Failed")

    def close(self) -> None:
        """Unblock the reader (a deleted pod's stream may stay open for its grace period)."""
        self._closed.set()
        resp = self._resp
        if resp is not None:
            try:
                resp.shutdown()
            except Exception:  # noqa: BLE001 (already closed)
                pass

    def _take(self, raw: bytes) -> None:
        text = raw.decode("utf-8", errors="replace").rstrip("\r")
        stamp, _, line = text.partition(" ")
        us = _stamp_us(stamp)
        if us is None:
            line = text  # no timestamp (not a kubelet): nothing to place the line by
        elif not self._last.is_new(us):
            return  # delivered before the stream was reopened
        self.tail.append(line)
        role, _, index = self.task.rpartition(":")
        self._controller.logs.line(role, int(index), line)
        self._controller.log(f"[{self.task}] {line}")


class LogPosition:
    """The newest log timestamp delivered, and how many lines carried exactly it (lines can
    share one), so that a reopened stream skips exactly what was already delivered."""

    def __init__(self):
        self.us: int | None = None
        self._count = 0
        self._seen_at_stamp = 0

    def is_new(self, us: int) -> bool:
        if self.us is not None and us < self.us:
            return False
        if us == self.us:
            self._seen_at_stamp += 1
            if self._seen_at_stamp <= self._count:
                return False
            self._count += 1
            return True
        self.us, self._count, self._seen_at_stamp = us, 1, 1
        return True

    def rewind(self) -> None:
        """A new stream starts: count the lines at the newest timestamp again."""
        self._seen_at_stamp = 0


def _stamp_us(stamp: str) -> int | None:
    """A kubelet log timestamp (RFC3339 with nanoseconds) -> microseconds since 1970.
    datetime drops the last three digits; lines that then share a stamp are counted apart
    by LogPosition, so nothing is lost."""
    try:
        return (datetime.fromisoformat(stamp) - _EPOCH) // timedelta(microseconds=1)
    except ValueError:
        return None


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
