"""Provisioning attempts of one worker step: preempted or lost workers are provisioned again.

`AttemptLoop` wraps any backend's controller. Each attempt gets a fresh controller (new
processes, pods, job or VM command for the same step and run folder, so the workers resume
from the step's checkpoint) with `BERTFLOW_ATTEMPT` (1-based) in every worker's environment,
and ends as one of:

- "success": the controller returned;
- "preempted": a worker exited PREEMPTED_EXIT_CODE (75), or wrote
  `{run}/{step}/preemption/{role}-{index}.json` during the attempt (it saved after a notice);
- "lost": a worker vanished without notice (pod or VM gone, SIGKILL, node removed): the
  controller raised WorkerLost;
- "failed": any other WorkerError; it fails the task as before.

Preempted and lost attempts are re-provisioned up to `cfg.max_preemptions` times inside the
same Airflow task try, so they spend none of Airflow's retries. Every attempt is appended to
`{run}/{step}/attempts.json` (a new task try continues the list and its numbering).
"""
from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Callable

from tasks.config import RunConfig

from tasks.io.uris import join_uri
from tasks.errors import PREEMPTED_EXIT_CODE, WorkerError
from tasks.io import storage
from tasks.provision.spec import WorkerSpec
from tasks.runs.runlayout import RunContext

ATTEMPT_ENV = "BERTFLOW_ATTEMPT"
OUTCOMES = ("success", "preempted", "failed", "lost")


class WorkerPreempted(WorkerError):
    """A worker ended with PREEMPTED_EXIT_CODE: it saved at a step boundary; resume it."""


class WorkerLost(WorkerError):
    """A worker vanished without notice (its pod, node or VM went away, or SIGKILL)."""


def outcome_of_exit(code: int | None) -> type[WorkerError]:
    """The error class for a worker's exit code (75 means preempted and saved)."""
    return WorkerPreempted if code == PREEMPTED_EXIT_CODE else WorkerError


def attempts_uri(ctx: RunContext, step: str) -> str:
    return join_uri(ctx.step_uri(step), "attempts.json")


def preemption_prefix(ctx: RunContext, step: str) -> str:
    return join_uri(ctx.step_uri(step), "preemption")


def read_attempts(ctx: RunContext, step: str) -> list[dict]:
    uri = attempts_uri(ctx, step)
    return list(storage.read_json(uri)) if storage.exists(uri) else []


def _notices(ctx: RunContext, step: str) -> dict[str, bytes]:
    """Preemption files of the step, by URI, with their content (to spot new ones)."""
    out = {}
    for uri in storage.list_uris(preemption_prefix(ctx, step)):
        if uri.endswith(".json"):
            try:
                out[uri] = storage.read_bytes(uri)
            except Exception:  # noqa: BLE001 (being written; the next look sees it)
                continue
    return out


class AttemptLoop:
    """`run()` blocks until the step succeeds, fails, or exceeds the bound; `stop()` may be
    called from any thread (Airflow's on_kill) and stops the current attempt."""

    def __init__(self, make_controller: Callable[[WorkerSpec], object], cfg: RunConfig,
                 ctx: RunContext, spec: WorkerSpec, log: Callable[[str], None] = print):
        self._make = make_controller
        self.cfg, self.ctx, self.spec, self.log = cfg, ctx, spec, log
        self._stopped = threading.Event()
        self._current = None
        self._lock = threading.Lock()

    def run(self) -> None:
        step = self.spec.step
        history = read_attempts(self.ctx, step)
        reprovisions = 0
        while True:
            number = len(history) + 1
            before = _notices(self.ctx, step)
            entry = {"attempt": number, "requested_at": time.time(), "running_at": None,
                     "ended_at": None, "outcome": None}
            spec = replace(self.spec, env={**self.spec.env, ATTEMPT_ENV: str(number)})
            error: WorkerError | None = None
            controller = None
            try:
                with self._lock:
                    if self._stopped.is_set():
                        raise WorkerError(f"{step} workers stopped before finishing")
                    controller = self._current = self._make(spec)
                controller.run()
                outcome = "success"
            except WorkerError as err:
                error = err
                outcome = self._classify(err, before)
            finally:
                entry["running_at"] = getattr(controller, "running_at", None)
                entry["ended_at"] = time.time()
            if self._stopped.is_set() and outcome != "success":
                outcome = "failed"  # Airflow killed the task: not a preemption
            entry["outcome"] = outcome
            history.append(entry)
            storage.write_json(attempts_uri(self.ctx, step), history)
            if outcome == "success":
                return
            if outcome == "failed":
                raise error
            if reprovisions >= self.cfg.max_preemptions:
                raise WorkerError(
                    f"{step} workers were {outcome} again (attempt {number}) after "
                    f"{reprovisions} re-provisions, the limit set by max_preemptions "
                    f"({self.cfg.max_preemptions}); raise max_preemptions, or use capacity "
                    f"on_demand (attempts: {attempts_uri(self.ctx, step)}). Last: "
                    f"{str(error).splitlines()[0]}") from None
            reprovisions += 1
            self.log(f"[attempts] {step} attempt {number} was {outcome} "
                     f"({str(error).splitlines()[0][:200]}); provisioning again "
                     f"({reprovisions} of max_preemptions {self.cfg.max_preemptions}); the "
                     f"workers resume from the latest checkpoint")

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            current = self._current
        if current is not None:
            current.stop()

    def _classify(self, err: WorkerError, before: dict[str, bytes]) -> str:
        if isinstance(err, WorkerPreempted):
            return "preempted"
        # A worker that saved after a notice wrote its file, even if the platform then took
        # its pod or VM before the controller saw the exit code.
        after = _notices(self.ctx, self.spec.step)
        if any(before.get(uri) != data for uri, data in after.items()):
            return "preempted"
        return "lost" if isinstance(err, WorkerLost) else "failed"


def run_step(backend, cfg: RunConfig, ctx: RunContext, spec: WorkerSpec, *, log,
             secrets: dict[str, str]) -> AttemptLoop:
    """An AttemptLoop over `backend.controller(...)`; call `.run()` (and `.stop()`)."""
    return AttemptLoop(lambda s: backend.controller(cfg, ctx, s, log=log, secrets=secrets),
                       cfg, ctx, spec, log)
