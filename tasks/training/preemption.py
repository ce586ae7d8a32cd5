"""Preemption notices for training workers: notice, agree on one step boundary, save, exit 75.

A worker learns it will lose its machine from SIGTERM (GKE graceful node shutdown, Vertex AI,
a local controller) or, on Compute Engine, from the metadata server. The cluster then stops
at ONE optimizer step boundary, the chief checkpoints it, every process writes
`{step}/preemption/{role}-{index}.json` and exits PREEMPTED_EXIT_CODE (75).

Agreement is hand-written here rather than taken from tf.distribute's
PreemptionCheckpointHandler, which only logs a warning on Google Cloud CPU and TPU hosts and
raises NotImplementedError under ParameterServerStrategy; one rule for every strategy:
- lockstep strategies (multi_worker_mirrored, mirrored, one_device): after each step every
  worker adds "have I been told?" (0 or 1) to a SUM all-reduce, so all see the same answer at
  the same step (one scalar collective per step);
- parameter_server: the chief owns the loop and alone decides. A worker or ps that is told
  writes a notice under `{step}/preemption-notices/`, which a thread of the chief watches;
  the server keeps serving until the chief has saved (or the grace period ends).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from tasks.io.uris import join_uri
from tasks.errors import PREEMPTED_EXIT_CODE
from tasks.io import storage

# google-auth's variable for the metadata server's host (google/auth/environment_vars.py);
# a test points it at a fake server on loopback.
METADATA_HOST_ENV = "GCE_METADATA_HOST"
DEFAULT_METADATA_HOST = "metadata.google.internal"
# Values from Google's docs: "Query metadata server for maintenance event notices"
# (maintenance-event is NONE until about 60 s before a live migration or termination, then
# MIGRATE_ON_HOST_MAINTENANCE or TERMINATE_ON_HOST_MAINTENANCE) and "Detect if a VM was
# preempted" (instance/preempted turns from FALSE to TRUE).
METADATA_KEYS = {"maintenance-event": ("NONE",), "preempted": ("FALSE",)}
NOTICES = "preemption-notices"
PREEMPTION = "preemption"
GRACE_SECONDS = 25.0  # a server waits this long for the chief's save (GKE spot gives ~30 s)


class Preempted(Exception):
    """Raised out of the training loop after the agreed step was checkpointed."""

    def __init__(self, step: int):
        super().__init__(f"preempted: saved at step {step}")
        self.step = step


@dataclass
class Notice:
    signal: str
    noticed_at: float


class Watcher:
    """Collects the first preemption notice this process gets (a signal, the metadata
    server, or a peer's notice file)."""

    def __init__(self):
        self.notice: Notice | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.on_notice = None  # called once, from whichever thread noticed

    def notify(self, source: str) -> None:
        with self._lock:
            if self.notice is not None:
                return
            self.notice = Notice(source, time.time())
        print(f"preemption: notice ({source}); stopping at the next step boundary", flush=True)
        if self.on_notice is not None:
            self.on_notice()

    @property
    def noticed(self) -> bool:
        return self.notice is not None

    def install(self) -> "Watcher":
        """SIGTERM handler (main thread only), plus metadata-server watchers on Compute
        Engine."""
        self.install_signal()
        if on_gce():
            host = os.environ.get(METADATA_HOST_ENV) or DEFAULT_METADATA_HOST
            for key, quiet in METADATA_KEYS.items():
                threading.Thread(target=watch_metadata, args=(host, key, quiet, self),
                                 daemon=True, name=f"metadata-{key}").start()
        return self

    def install_signal(self) -> None:
        """Take SIGTERM (again): MultiWorkerMirrored's coordination service installs its own
        handler (preemption_notifier.cc: "SIGTERM caught"), which only logs, when the
        strategy is built."""
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, lambda signum, frame: self.notify("SIGTERM"))
            if getattr(self, "_previous", None) is None:
                self._previous = previous

    def watch_notices(self, step_uri: str, attempt: int, every: float = 1.0) -> None:
        """Parameter-server chief: notice files of this attempt's workers and ps count as
        notices."""
        prefix = notices_uri(step_uri, attempt)

        def poll():
            while not self._stop.wait(every):
                try:
                    found = storage.list_uris(prefix)
                except Exception:  # a flaky listing must not kill the chief
                    continue
                if found:
                    name = found[0].rstrip("/").rsplit("/", 1)[-1].removesuffix(".json")
                    self.notify(f"peer {name}: {storage.read_json(found[0])['signal']}")
                    return

        threading.Thread(target=poll, daemon=True, name="preemption-notices").start()

    def close(self) -> None:
        """Stop watching; the SIGTERM handler this process had before comes back."""
        self._stop.set()
        if getattr(self, "_previous", None) is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None


def on_gce() -> bool:
    """Compute Engine, detected as google-auth does without a network call (the SMBIOS product
    name), or a metadata host set explicitly."""
    if os.environ.get(METADATA_HOST_ENV):
        return True
    from google.auth.compute_engine import _metadata
    return _metadata.detect_gce_residency_linux()


def watch_metadata(host: str, key: str, quiet: tuple[str, ...], watcher: Watcher) -> None:
    """Long-poll `instance/{key}` (wait_for_change with the last ETag, as Google's docs
    show) until it leaves its quiet value, then notify."""
    url = f"http://{host}/computeMetadata/v1/instance/{key}"
    etag = None
    while not watcher.noticed:
        query = "?wait_for_change=true" + (f"&last_etag={etag}" if etag else "")
        request = urllib.request.Request(url + (query if etag else ""),
                                         headers={"Metadata-Flavor": "Google"})
        try:
            with urllib.request.urlopen(request, timeout=3600) as response:
                value = response.read().decode().strip()
                etag = response.headers.get("ETag") or etag or "0"
        except (urllib.error.URLError, OSError):
            time.sleep(5)
            continue
        if value and value not in quiet:
            watcher.notify(key if key != "preempted" else "preempted")
            return


class Agreement:
    """Whether the cluster stops at this step boundary: the same answer on every worker of a
    lockstep strategy, the chief's own answer under parameter_server."""

    def __init__(self, strategy, name: str, watcher: Watcher):
        from tasks.training.strategy import any_worker

        self.watcher = watcher
        self._any = any_worker(strategy, name)

    def should_stop(self) -> bool:
        stop = self._any(self.watcher.noticed)
        if stop:
            # Told by a peer: recorded as such, even if this process's own SIGTERM (the
            # controller stopping the rest of the cluster) arrives before its record is written.
            self.watcher.notify("peer")
        return stop


def notices_uri(step_uri: str, attempt: int) -> str:
    return join_uri(step_uri, NOTICES, f"attempt-{attempt}")


def record_uri(step_uri: str, role: str, index: int) -> str:
    return join_uri(step_uri, PREEMPTION, f"{role}-{index}.json")


def write_record(step_uri: str, role: str, index: int, step: int, watcher: Watcher,
                 saved_at: float) -> None:
    notice = watcher.notice or Notice("peer", saved_at)
    storage.write_json(record_uri(step_uri, role, index), {
        "step": step, "signal": notice.signal, "noticed_at": round(notice.noticed_at, 3),
        "saved_at": round(saved_at, 3)})


def exit_preempted() -> None:
    """Exit 75 at once: a normal interpreter exit can wait on cluster shutdown barriers that
    peers which have already gone never reach."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(PREEMPTED_EXIT_CODE)


def serve_until_preempted(watcher: Watcher, step_uri: str, role: str, index: int,
                          attempt: int, started_at: float,
                          grace_seconds: float = GRACE_SECONDS):
    """The stop test for a parameter_server worker or ps: once told, write a notice for the
    chief, keep serving until the chief has saved (its record, written after this process
    started, appears) or the grace period ends, then write this process's record and exit
    75."""
    finished = join_uri(step_uri, "manifest.json")  # the chief succeeded: nothing to save

    def told():
        if storage.exists(finished):
            return
        storage.write_json(join_uri(notices_uri(step_uri, attempt), f"{role}-{index}.json"), {
            "signal": watcher.notice.signal, "noticed_at": watcher.notice.noticed_at})

    watcher.on_notice = told

    def stop() -> bool:
        if not watcher.noticed:
            return False
        deadline = watcher.notice.noticed_at + grace_seconds
        chief = record_uri(step_uri, "chief", 0)

        def saved() -> dict | None:
            record = storage.read_json(chief) if storage.exists(chief) else None
            return record if record and record["saved_at"] >= started_at else None

        while time.time() < deadline and saved() is None:
            if storage.exists(finished):
                os._exit(0)
            time.sleep(0.2)
        step = (saved() or {}).get("step", -1)
        write_record(step_uri, role, index, step, watcher, time.time())
        exit_preempted()
        return True

    return stop
