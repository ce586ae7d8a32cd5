"""Preemption on real multi-process clusters on loopback (LocalCluster, TF_CONFIG), tiny random
BERT with dropout 0.1 (masks drawn from seed, step, layer and replica:
tasks/training/seeded_dropout.py), so CPU training is deterministic across a resume:

- multi_worker_mirrored: SIGTERM to worker 1 mid-epoch; both workers save at one step and exit
  75; attempt 2 resumes there and ends with the weights of an uninterrupted run, bit for bit,
  with zero steps recomputed; the goodput parts add up to the train step's wall time.
- parameter_server (chief + 1 worker + 1 ps): SIGTERM to the worker; it tells the chief by a
  notice file, the chief stops and saves, all three exit 75, the resumed run ends with the
  weights of an uninterrupted run, bit for bit. With one worker the coordinator runs the steps
  one after another, so the order of updates on the ps is fixed; with more workers it is not
  (asynchronous training), and only completion could be compared.
- SIGKILL with no notice loses at most checkpoint_every_steps.
- the Compute Engine maintenance-event path, against a small fake metadata server on loopback
  (the only mock: it stands in for metadata.google.internal, driven through GCE_METADATA_HOST).

The LocalCluster here is the real local controller, which writes attempts.json; the tests play
the re-provisioning part (attempt 2 after a preempted attempt 1).
"""
from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tasks.errors import PREEMPTED_EXIT_CODE, WorkerError
from tasks.provision.local.cluster import LocalCluster
from tasks.provision.spec import distributed_spec
from tasks.provision.attempts import AttemptLoop, read_attempts
from tasks.runs import goodput, run_summary
from tasks.runs.runlayout import read_manifest
from train_helpers import saved_weights, make_run, write_tiny_model

FIXED = (10, 10)  # one batch shape: one trace of the train function
# 128 rows / 16 = 8 steps per epoch, 2 epochs: a notice at step 3 lands mid-epoch.
COMMON = dict(per_replica_batch_size=8, epochs=2, learning_rate=1e-2, warmup_ratio=0.25,
              weight_decay=0.01, checkpoint_every_steps=100)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-model"), hidden_dropout_prob=0.1,
                            attention_probs_dropout_prob=0.1)


def attempt(cfg, ctx, n: int, lines: list[str], when=None, env: dict | None = None):
    """Run attempt n of the train step through the real controller loop
    (tasks.provision.attempts.AttemptLoop over LocalCluster) with max_preemptions 0, so that it
    runs this one attempt, records it in attempts.json and sets BERTFLOW_ATTEMPT; the test then
    plays the re-provisioning (attempt n + 1). `when(line, cluster)` sees each log line (to send
    a signal at the right moment). Returns (the attempt: outcome and cluster, the error)."""
    record = Path(ctx.run_uri) / f"pids-{n}.json"
    current = SimpleNamespace(cluster=None, outcome=None)

    def log(line):
        lines.append(line)
        if when is not None and current.cluster is not None:
            when(line, current.cluster)

    def make(spec):
        current.cluster = LocalCluster(spec, log=log, grace_seconds=30,
                                       record_uri=str(record), extra_env=env)
        return current.cluster

    loop = AttemptLoop(make, cfg.model_copy(update={"max_preemptions": 0}), ctx,
                       distributed_spec(cfg, "train", ctx.run_uri), log)
    error = None
    try:
        loop.run()
    except WorkerError as err:
        error = err
    history = read_attempts(ctx, "train")
    assert len(history) == n, history
    current.outcome = history[-1]["outcome"]
    return current, error


def signal_at(step: int, role: str, index: int, sig: int):
    """A `when` that sends `sig` to role:index once a log line reports `step`."""
    sent = threading.Event()

    def when(line, cluster):
        if sent.is_set() or f"] step {step}/" not in line:
            return
        sent.set()
        pid = next(p.popen.pid for p in cluster._procs if (p.role, p.index) == (role, index))
        os.kill(pid, sig)

    when.sent = sent
    return when


def preemption_records(ctx) -> dict[str, dict]:
    folder = Path(ctx.step_uri("train")) / "preemption"
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def check_goodput_adds_up(ctx) -> dict:
    result = goodput.read_goodput(ctx.step_uri("train"))
    attempts = json.loads((Path(ctx.step_uri("train")) / "attempts.json").read_text())
    wall = round(attempts[-1]["ended_at"] * 1000) - round(attempts[0]["requested_at"] * 1000)
    assert result["total_ms"] == wall
    assert sum(result["parts_ms"].values()) == wall  # exactly, in milliseconds
    assert result["parts_ms"]["other_s"] >= 0
    assert 0 < result["goodput"] < 1
    for key in ("waiting_for_capacity_s", "startup_s", "productive_s", "checkpoint_s"):
        assert result["parts"][key] > 0, (key, result)
    # The evaluation after training is its own part, where the train step evaluates.
    evaluated = read_manifest(ctx.manifest_uri("train")).get("evaluation")
    assert (result["parts"]["evaluation_s"] > 0) is bool(evaluated), result
    return result


def test_a_process_start_is_read_to_the_clock_tick():
    """Start-up is counted from the process's start: read to /proc's 10 ms tick (btime, whole
    seconds, put it up to 1 s early and the attempt's clipping then took the checkpoint's
    share)."""
    script = ("import json, time\ntime.sleep(0.5)\n"
              "from tasks.training.goodput_clock import process_started_at\n"
              "print(json.dumps([process_started_at(), time.time()]))")
    before = time.time()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True, cwd=Path(__file__).resolve().parent.parent)
    started, printed = json.loads(done.stdout)
    assert before - 0.02 <= started <= printed - 0.5 + 0.02, (before, started, printed)


def test_mwms_sigterm_mid_epoch_resumes_exactly(tmp_path, tiny_model):
    ref = make_run(tmp_path / "ref", tiny_model, 128, 16, FIXED,
                   strategy="multi_worker_mirrored", num_workers=2, **COMMON)
    run = make_run(tmp_path / "run", tiny_model, 128, 16, FIXED,
                   strategy="multi_worker_mirrored", num_workers=2, **COMMON)
    ref_lines: list[str] = []
    reference = threading.Thread(target=lambda: ref_lines.append(attempt(*ref, 1, [])))
    reference.start()
    lines: list[str] = []
    when = signal_at(3, "worker", 1, signal.SIGTERM)
    try:
        cluster, err = attempt(*run, 1, lines, when)
    finally:
        reference.join()
    assert when.sent.is_set() and err is not None, "\n".join(lines[-30:])
    assert cluster.outcome == "preempted", str(err)
    assert f"exited with code {PREEMPTED_EXIT_CODE}" in str(err)
    records = preemption_records(run[1])
    assert set(records) == {"worker-0", "worker-1"}, records
    saved = {r["step"] for r in records.values()}
    assert len(saved) == 1  # one step boundary for the whole cluster
    step = saved.pop()
    assert 3 <= step < 8  # mid-epoch (8 steps per epoch)
    assert records["worker-1"]["signal"] == "SIGTERM"
    assert records["worker-0"]["signal"] == "peer"
    for r in records.values():
        assert r["noticed_at"] <= r["saved_at"]

    cluster, err = attempt(*run, 2, lines)
    assert err is None, str(err)
    manifest = read_manifest(run[1].manifest_uri("train"))
    assert manifest["resumed_from_step"] == step
    assert manifest["steps"] == manifest["total_steps"] == 16
    assert ref_lines[0][1] is None, str(ref_lines[0][1])
    a = saved_weights(Path(manifest["model_dir"]))
    b = saved_weights(Path(read_manifest(ref[1].manifest_uri("train"))["model_dir"]))
    assert a.keys() == b.keys() and len(a) > 30
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)

    # Zero steps recomputed: attempt 1 saved the last step it ran.
    parts1 = json.loads((Path(run[1].step_uri("train")) / "goodput" /
                         "attempt-1-worker-0.json").read_text())
    assert parts1["last_step"] == step
    result = check_goodput_adds_up(run[1])
    assert result["recomputed_steps"] == 0 and result["parts"]["recomputed_s"] == 0
    assert result["attempts"] == 2 and result["preemptions"] == 1
    # The run summary (experiments table, run page) carries it.
    detail = run_summary.run_detail(str(tmp_path / "run"), "test", "run1")
    assert detail["goodput"] == result["goodput"]
    assert detail["goodput_detail"]["parts_ms"] == result["parts_ms"]
    # History keeps one record per step across the two attempts.
    history = json.loads((Path(run[1].step_uri("train")) / "history.json").read_text())
    assert [r["step"] for r in history["records"]] == list(range(1, 17))


def test_parameter_server_worker_sigterm_chief_saves_and_resumes(tmp_path, tiny_model):
    # 24 epochs (384 steps of a tiny model), SIGTERM as soon as the chief logs its first
    # chunk (step 100): mid-run whatever the load. A fixed 8 s after the first log line came
    # before the first step on a loaded machine (the cluster was still connecting).
    ps = dict(strategy="parameter_server", num_workers=1, num_ps=1, **{**COMMON, "epochs": 24})
    cfg, ctx = make_run(tmp_path / "run", tiny_model, 128, 16, FIXED, **ps)
    ref = make_run(tmp_path / "ref", tiny_model, 128, 16, FIXED, **ps)
    ref_result: list = []
    reference = threading.Thread(target=lambda: ref_result.append(attempt(*ref, 1, [])))
    reference.start()
    lines: list[str] = []
    notice = threading.Event()

    def when(line, cluster):  # the chief logs every chunk (checkpoint_every_steps) only
        if notice.is_set() or not line.startswith("[chief:0] step 100/"):
            return
        notice.set()
        pid = next(p.popen.pid for p in cluster._procs if (p.role, p.index) == ("worker", 0))
        os.kill(pid, signal.SIGTERM)

    try:
        cluster, err = attempt(cfg, ctx, 1, lines, when)
    finally:
        reference.join()
    assert err is not None and cluster.outcome == "preempted", "\n".join(lines[-30:])
    records = preemption_records(ctx)
    assert set(records) >= {"chief-0", "worker-0"}, "\n".join(
        [str(records)] + [ln for ln in lines if ln.startswith("[chief:0]")][-40:])
    step = records["chief-0"]["step"]
    assert records["worker-0"]["step"] == step and records["worker-0"]["signal"] == "SIGTERM"
    assert records["chief-0"]["signal"].startswith("peer worker-0")
    assert 0 < step < 384  # 128 rows / 8 per step x 24 epochs

    cluster, err = attempt(cfg, ctx, 2, lines)
    assert err is None, str(err)
    manifest = read_manifest(ctx.manifest_uri("train"))
    assert manifest["resumed_from_step"] == step and manifest["steps"] == 384
    result = check_goodput_adds_up(ctx)
    assert result["recomputed_steps"] == 0
    assert ref_result[0][1] is None, str(ref_result[0][1])
    a = saved_weights(Path(manifest["model_dir"]))
    b = saved_weights(Path(read_manifest(ref[1].manifest_uri("train"))["model_dir"]))
    diff = max(float(np.abs(a[k] - b[k]).max()) for k in a)
    print(f"PS resumed at step {step} vs uninterrupted: max |weight difference| {diff:.3g}")
    assert diff == 0.0


def test_sigkill_loses_at_most_checkpoint_every_steps(tmp_path, tiny_model):
    every = 4
    cfg, ctx = make_run(tmp_path, tiny_model, 128, 16, FIXED, strategy="one_device",
                        **{**COMMON, "checkpoint_every_steps": every})
    lines: list[str] = []
    when = signal_at(6, "worker", 0, signal.SIGKILL)  # after the checkpoint at step 4
    cluster, err = attempt(cfg, ctx, 1, lines, when, env={"BERTFLOW_GOODPUT_FLUSH_SECONDS": "0"})
    assert err is not None and cluster.outcome == "lost", "\n".join(lines[-30:])
    assert not preemption_records(ctx)
    cluster, err = attempt(cfg, ctx, 2, lines, env={"BERTFLOW_GOODPUT_FLUSH_SECONDS": "0"})
    assert err is None, str(err)
    manifest = read_manifest(ctx.manifest_uri("train"))
    assert manifest["resumed_from_step"] == 4 and manifest["steps"] == 32
    result = check_goodput_adds_up(ctx)
    assert 1 <= result["recomputed_steps"] <= every
    assert result["parts"]["recomputed_s"] > 0 and result["lost"] == 1


class FakeMetadata(http.server.ThreadingHTTPServer):
    """metadata.google.internal's two keys, as Google's docs describe them: a plain GET
    answers at once; ?wait_for_change=true blocks until the value changes. Requests without
    Metadata-Flavor: Google get 403, as from the real server."""

    def __init__(self):
        self.event = threading.Event()
        self.requests: list[str] = []
        super().__init__(("127.0.0.1", 0), self.Handler)
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            server = self.server
            server.requests.append(self.path)
            if self.headers.get("Metadata-Flavor") != "Google":
                return self._send(403, "Missing Metadata-Flavor:Google header.", "")
            key = self.path.split("?")[0].rsplit("/", 1)[-1]
            if "wait_for_change=true" in self.path:
                if key != "maintenance-event":
                    time.sleep(30)
                else:
                    server.event.wait(60)
            changed = key == "maintenance-event" and server.event.is_set()
            quiet = {"maintenance-event": "NONE", "preempted": "FALSE"}[key]
            self._send(200, "TERMINATE_ON_HOST_MAINTENANCE" if changed else quiet,
                       "e2" if changed else "e1")

        def _send(self, code, body, etag):
            self.send_response(code)
            self.send_header("Content-Type", "application/text")
            if etag:
                self.send_header("ETag", etag)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass


def test_maintenance_event_from_the_metadata_server(tmp_path, tiny_model):
    cfg, ctx = make_run(tmp_path, tiny_model, 128, 16, FIXED, strategy="one_device", **COMMON)
    server = FakeMetadata()
    lines: list[str] = []

    def when(line, cluster):
        if "] step 3/" in line:
            server.event.set()

    try:
        cluster, err = attempt(cfg, ctx, 1, lines, when, env={
            "GCE_METADATA_HOST": f"127.0.0.1:{server.server_address[1]}"})
    finally:
        server.shutdown()
    assert err is not None and cluster.outcome == "preempted", "\n".join(lines[-30:])
    record = preemption_records(ctx)["chief-0"]  # a lone process: chief 0 (no TF_CONFIG)
    assert record["signal"] == "maintenance-event" and 3 <= record["step"] < 32
    assert any("maintenance-event?wait_for_change=true&last_etag=e1" in r
               for r in server.requests)


def test_goodput_combine_splits_the_wall_time_exactly():
    """Pure: a preempted attempt, a lost one, a successful one, with gaps to re-provision."""
    attempts = [
        {"attempt": 1, "requested_at": 100.0, "running_at": 130.0, "ended_at": 200.0,
         "outcome": "preempted"},
        {"attempt": 2, "requested_at": 205.0, "running_at": 215.5, "ended_at": 300.0,
         "outcome": "lost"},
        {"attempt": 3, "requested_at": 310.0, "running_at": 311.0, "ended_at": 400.123,
         "outcome": "success"},
    ]
    parts = {
        1: {"startup_s": 10.0, "productive_s": 50.0, "checkpoint_s": 5.0, "recomputed_s": 0.0,
            "recomputed_steps": 0, "written_at": 199.0},
        2: {"startup_s": 8.0, "productive_s": 40.0, "checkpoint_s": 2.0, "recomputed_s": 0.0,
            "recomputed_steps": 0, "written_at": 280.0},  # then 20 s of work lost
        3: {"startup_s": 7.0, "productive_s": 60.0, "checkpoint_s": 3.0, "recomputed_s": 4.0,
            "recomputed_steps": 3, "written_at": 399.0},
    }
    result = goodput.combine(attempts, parts)
    assert result["total_ms"] == 300_123
    assert sum(result["parts_ms"].values()) == 300_123
    p = result["parts"]
    assert p["waiting_for_capacity_s"] == 30 + 5 + 10.5 + 10 + 1
    assert p["startup_s"] == 25 and p["productive_s"] == 150 and p["checkpoint_s"] == 10
    assert p["recomputed_s"] == 4 + 20  # attempt 3 redoing steps + attempt 2's lost tail
    assert p["other_s"] == pytest.approx(300.123 - 56.5 - 25 - 150 - 10 - 24)
    assert result["goodput"] == round(150 / 300.123, 4)
    assert (result["attempts"], result["preemptions"], result["lost"],
            result["recomputed_steps"]) == (3, 1, 1, 3)
    assert goodput.describe(result).startswith("50.0% of 300.1 s over 3 attempt(s)")
