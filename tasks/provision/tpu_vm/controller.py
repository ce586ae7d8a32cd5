"""The controller of one step on a Cloud TPU VM: it writes the step request into the run
folder, follows the agent's heartbeat and log chunks (tasks/provision/tpu_vm/agent.py), and
tells a platform reclaim of a spot TPU (WorkerLost) from a failure."""
from __future__ import annotations

import shlex
import threading
import time

from tasks.config import RunConfig
from tasks.errors import BertflowError, WorkerError
from tasks.io import storage
from tasks.provision.attempts import WorkerLost, outcome_of_exit
from tasks.provision.backends import Log
from tasks.provision.spec import WorkerSpec
from tasks.provision.tpu_vm.client import errors, taken_back, tpu_state
from tasks.provision.tpu_vm.render import agent_uri, step_request
from tasks.runs.runlayout import RunContext

TAIL_LINES = 30


class TpuStepController:
    """Runs one step on the TPU VM through its agent. `run()` blocks; `stop()` from any
    thread writes the cancel file, and run() then raises.

    A retried Airflow task whose step is still running on the VM (no status yet) attaches to
    it instead of starting it twice; a finished step is run again under the next id."""

    poll_seconds = 2.0
    # No sign of the agent for this long after the request: the VM never started it.
    pickup_seconds: float | None = None  # None: the config's schedule_timeout_seconds
    # The agent's heartbeat did not change for this long while the step ran: it died.
    stale_seconds = 600.0
    # Spot runs: how often the TPU API is asked whether Cloud TPU took the TPU back, so that a
    # reclaim ends the attempt within about this long, not after stale_seconds.
    reclaim_check_seconds = 60.0
    # How often the node's expiry label is moved ahead while the step runs (a sweep deletes a
    # TPU whose label has passed; the label set at creation covers one step's lifetime).
    renew_seconds = 600.0

    def __init__(self, cfg: RunConfig, ctx: RunContext, spec: WorkerSpec, *, log: Log,
                 backend):
        self.cfg, self.ctx, self.spec, self.log = cfg, ctx, spec, log
        # The TpuVmBackend: asked for the TPU's state, and to queue a reclaimed TPU again.
        self.backend = backend
        self.request_id: str | None = None
        self._stopped = threading.Event()
        self._seen: set[str] = set()
        self._tail: list[str] = []
        self.running_at: float | None = None

    def _uri(self, *parts: str) -> str:
        return agent_uri(self.ctx, *parts)

    def stop(self) -> None:
        self._stopped.set()
        if self.request_id:
            try:
                storage.write_json(self._uri("cancel", f"{self.request_id}.json"),
                                   {"at": time.time()})
            except BertflowError as err:
                self.log(f"[tpu] could not write the cancel request: {err}")

    def run(self) -> None:
        self.request_id = self._submit()
        if self._stopped.is_set():  # stop() came while submitting
            self.stop()
            raise WorkerError("the TPU step was stopped before it finished")
        pickup = self.pickup_seconds or self.cfg.schedule_timeout_seconds
        started = time.monotonic()
        heartbeat, heartbeat_seen = None, time.monotonic()
        picked_up = False
        checked = renewed = time.monotonic()
        while True:
            status = self._status(self.request_id)
            picked_up = self._stream() or picked_up
            if status is not None:
                self._stream()
                if self.running_at is None:  # a step that ended before a heartbeat said so
                    self.running_at = time.time()
                return self._finish(status)
            if self._stopped.is_set():
                raise WorkerError(f"tpu:0 {self.spec.step} was stopped (cancel requested)")
            agent = self._agent()
            if agent is not None and agent != heartbeat:
                heartbeat, heartbeat_seen = agent, time.monotonic()
                picked_up = picked_up or agent.get("running") == self.request_id
                if picked_up and self.running_at is None:
                    self.running_at = time.time()  # the step started on the VM (attempts.py)
            now = time.monotonic()
            if not picked_up and now - started > pickup:
                raise self._silence(
                    f"the TPU VM's agent did not pick up {self.request_id} within {pickup:.0f}s "
                    f"(last heartbeat: {heartbeat or 'none'})",
                    "Check the VM's startup stages (its serial console, or sudo journalctl -t "
                    "bertflow-startup -u google-startup-scripts), the agent's (sudo docker "
                    "logs bertflow-agent), "
                    "and that its service account can read and write the run folder and pull "
                    "the image")
            if picked_up and self.cfg.capacity == "spot" and \
                    now - checked >= self.reclaim_check_seconds:
                checked = now
                lost = self._reclaimed("the TPU VM went away while running "
                                       f"{self.request_id}")
                if lost is not None:
                    raise lost
            if picked_up and now - renewed >= self.renew_seconds:
                renewed = now
                self._renew()
            if picked_up and now - heartbeat_seen > self.stale_seconds:
                raise self._silence(
                    f"the TPU VM's agent stopped answering while running {self.request_id} "
                    f"(no heartbeat for {self.stale_seconds:.0f}s)",
                    "The VM was restarted or deleted, or the agent died (sudo docker logs "
                    "bertflow-agent on the VM); retry the task")
            self._stopped.wait(self.poll_seconds)

    def _renew(self) -> None:
        """Keep the TPU's expiry ahead of the running step; a failed renewal is logged and
        tried again at the next period (the label still has the rest of its lifetime)."""
        try:
            expires = self.backend.renew_expiry(self.cfg, self.ctx)
        except Exception as err:  # noqa: BLE001 (the step itself goes on)
            self.log(f"[tpu] could not renew the TPU's expiry label: "
                     f"{str(err).splitlines()[0][:200]}")
            return
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(expires)))
        self.log(f"[tpu] expiry label renewed to {when} while {self.request_id} runs")

    def _silence(self, what: str, hint: str) -> WorkerError:
        """The agent fell silent. WorkerLost when the TPU API says the platform took the spot
        TPU back: the request is marked so, and the next attempt queues the TPU again
        (_submit). Anything else stays a failure."""
        try:
            resource, node = self.backend.current(self.cfg, self.ctx)
        except Exception as err:  # noqa: BLE001 (a diagnosis must not hide the failure)
            return WorkerError(f"{what}; the TPU API could not say why ({err}). {hint}")
        if not taken_back(resource, node):
            return WorkerError(f"{what}; the TPU API says: {tpu_state(resource, node)}. {hint}")
        return self._lost(resource, node, what)

    def _reclaimed(self, what: str) -> WorkerLost | None:
        """WorkerLost (the request marked) if Cloud TPU took the spot TPU back, else None; a
        TPU API that does not answer now is asked again at the next check."""
        try:
            resource, node = self.backend.current(self.cfg, self.ctx)
        except Exception as err:  # noqa: BLE001 (the heartbeat check still guards the step)
            self.log(f"[tpu] could not ask the TPU API for the TPU's state: {err}")
            return None
        return self._lost(resource, node, what) if taken_back(resource, node) else None

    def _lost(self, resource, node, what: str) -> WorkerLost:
        state = tpu_state(resource, node)
        # A status, so that no agent runs this request again and the next attempt re-creates.
        storage.write_json(self._uri("status", f"{self.request_id}.json"), {
            "id": self.request_id, "exit_code": None, "reclaimed": state, "at": time.time()})
        return WorkerLost(f"Cloud TPU took the spot TPU back ({state}): {what}; the next "
                          "attempt queues the same TPU again and resumes from the checkpoint")

    def _submit(self) -> str:
        request_uri = self._uri("requests", f"{self.spec.step}.json")
        previous = storage.read_json(request_uri) if storage.exists(request_uri) else None
        status = self._status(previous["id"]) if previous else None
        if previous and status is None:
            self.log(f"[tpu] {previous['id']} is still running on the TPU VM (an earlier "
                     "attempt of this task); following it")
            return previous["id"]
        if status and status.get("reclaimed"):
            self._queue_again(previous["id"], status["reclaimed"])
        number = int(previous["id"].rsplit("-", 1)[1]) + 1 if previous else 1
        request_id = f"{self.spec.step}-{number:03d}"
        storage.write_json(request_uri, step_request(self.cfg, self.spec, request_id))
        self.log(f"[tpu] requested {request_id}: {shlex.join(self.spec.command)}")
        return request_id

    def _status(self, request_id: str) -> dict | None:
        """The request's status: the agent's when it ended, the controller's when the TPU
        was taken back (`reclaimed`), None while it runs."""
        uri = self._uri("status", f"{request_id}.json")
        return storage.read_json(uri) if storage.exists(uri) else None

    def _queue_again(self, lost: str, state: str) -> None:
        """The TPU under `lost` was taken back: setup deletes it and queues it again."""
        self.log(f"[tpu] {lost} lost its TPU ({state}); queueing the same TPU again")
        try:
            self.backend.setup(self.cfg, self.ctx, log=self.log, stop=self._stopped)
        except (BertflowError, errors().GoogleAPICallError) as err:
            raise WorkerError(f"Cloud TPU took the spot TPU back and queueing it again "
                              f"failed: {err}") from None

    def _agent(self) -> dict | None:
        uri = self._uri("agent.json")
        try:
            return storage.read_json(uri) if storage.exists(uri) else None
        except (BertflowError, ValueError):
            return None

    def _stream(self) -> bool:
        """Log the chunks not seen yet, in order; True when there were any."""
        prefix = self._uri("logs", self.request_id) + "/"
        chunks = sorted(u for u in storage.list_uris(prefix) if u.endswith(".txt"))
        new = [u for u in chunks if u not in self._seen]
        for uri in new:
            for line in storage.read_text(uri).splitlines():
                self.log(f"[tpu:0] {line}")
                self._tail.append(line)
            self._tail = self._tail[-TAIL_LINES:]
            self._seen.add(uri)
        return bool(new) or bool(chunks)

    def _finish(self, status: dict) -> None:
        code = status.get("exit_code")
        if code == 0:
            return
        tail = status.get("tail") or self._tail
        last = next((ln for ln in reversed(tail) if ln.strip()), "(no output)")
        why = " (cancelled)" if status.get("cancelled") else (
            " (timed out)" if status.get("timed_out") else "")
        # 75: preempted and saved (a maintenance event on a live VM); attempts.py runs the
        # step again on the same VM.
        raise outcome_of_exit(code)(f"tpu:0 exited with code {code}{why}: {last}\n--- last "
                                    f"output of tpu:0 ---\n" + "\n".join(tail))
