"""A worker's share of the goodput figure: where this process's time went, written to
`{step}/goodput/attempt-{n}-{role}-{index}.json` (tasks/runs/goodput.py combines the files).

Written at every checkpoint, every `flush_seconds` of steps and at exit, so that an attempt
lost without notice (SIGKILL, node gone) still tells how far it got.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager

from tasks.io.uris import join_uri
from tasks.io import storage

ATTEMPT_ENV = "BERTFLOW_ATTEMPT"  # set by the controller in every worker of attempt n
FLUSH_ENV = "BERTFLOW_GOODPUT_FLUSH_SECONDS"
GOODPUT = "goodput"


def process_started_at() -> float:
    """This process's start (unix s), from /proc on Linux; else now. Its age comes from the
    start tick against CLOCK_BOOTTIME (the clock /proc counts it on, to 10 ms), not from
    /proc/stat's btime: that is whole seconds, and put start-up up to 1 s early, more than the
    slack between a step's last report and its exit, so the goodput's clipping to the attempt
    took it from the checkpoint time."""
    try:
        ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - max(0.0, age)
    except (OSError, ValueError, AttributeError):
        return time.time()


def attempt_number() -> int:
    return int(os.environ.get(ATTEMPT_ENV) or 1)


def parts_uri(step_uri: str, attempt: int, role: str, index: int) -> str:
    return join_uri(step_uri, GOODPUT, f"attempt-{attempt}-{role}-{index}.json")


def previous_high_water(step_uri: str, attempt: int, role: str, index: int) -> int:
    """The highest step an earlier attempt of this process reported: steps up to it that run
    again are recomputed."""
    best = 0
    for n in range(1, attempt):
        uri = parts_uri(step_uri, n, role, index)
        if storage.exists(uri):
            best = max(best, storage.read_json(uri).get("last_step") or 0)
    return best


class GoodputClock:
    """Splits this attempt's time into start-up, productive steps, recomputed steps and
    checkpoint saves and the evaluation after training (`evaluate_in_train`)."""

    def __init__(self, uri: str | None, started_at: float, high_water: int,
                 flush_seconds: float | None = None):
        self.uri, self.started_at, self.high_water = uri, started_at, high_water
        self.flush_seconds = float(os.environ.get(FLUSH_ENV, 10.0)) \
            if flush_seconds is None else flush_seconds
        self.startup_s = self.productive_s = self.checkpoint_s = self.recomputed_s = 0.0
        self.evaluation_s = 0.0
        self.steps = self.recomputed_steps = 0
        self.first_step: int | None = None
        self.last_step: int | None = None
        self._last: float | None = None
        self._flushed = 0.0

    def loop_started(self, step: int) -> None:
        """Called right before the first step of this attempt (`step` already done)."""
        now = time.time()
        self.startup_s = now - self.started_at
        self._last = now
        self.first_step = self.last_step = step

    def step_done(self, step: int) -> None:
        now = time.time()
        if self._last is None:
            self.loop_started(step - 1)
            self._last = now
        elapsed, self._last = now - self._last, now
        done = max(0, step - (self.last_step or 0))
        redone = max(0, min(step, self.high_water) - (self.last_step or 0))
        if done:
            share = elapsed * redone / done
            self.recomputed_s += share
            self.productive_s += elapsed - share
            self.recomputed_steps += redone
            self.steps += done
        self.last_step = step
        if now - self._flushed >= self.flush_seconds:
            self.write()

    @contextmanager
    def checkpoint(self):
        with self._timed("checkpoint_s"):
            yield

    @contextmanager
    def evaluation(self):
        with self._timed("evaluation_s"):
            yield

    @contextmanager
    def _timed(self, part: str):
        start = time.time()
        try:
            yield
        finally:
            spent = time.time() - start
            setattr(self, part, getattr(self, part) + spent)
            if self._last is not None:
                self._last += spent  # the next step's time starts after it
            self.write()

    def to_dict(self) -> dict:
        return {"startup_s": round(self.startup_s, 3), "productive_s": round(self.productive_s, 3),
                "checkpoint_s": round(self.checkpoint_s, 3),
                "evaluation_s": round(self.evaluation_s, 3),
                "recomputed_steps": self.recomputed_steps,
                "recomputed_s": round(self.recomputed_s, 3), "steps": self.steps,
                "first_step": self.first_step, "last_step": self.last_step,
                "started_at": round(self.started_at, 3), "written_at": round(time.time(), 3)}

    def write(self) -> None:
        self._flushed = time.time()
        if self.uri is not None:
            storage.write_json(self.uri, self.to_dict())
