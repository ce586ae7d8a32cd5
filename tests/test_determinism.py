"""The `deterministic` Param (tasks/training/determinism.py, docs/preemption.md), with
the default CPU recipe: mixed_bfloat16, bertflow's CPU kernels, dropout. Every run is a
fresh train process (`python tests/test_determinism.py RUN_DIR [STEP]`), as a worker is.

- Two runs of one seed end with bitwise-equal weights.
- A run sent SIGTERM at step 11 (no other test stops a run there: 3, 5, 6, 7 and 14 are
  taken), mid-epoch, saves that step and exits 75; a fresh process resumes it, and it ends
  with the same bits; so do multi-label and regression runs stopped at step 13.

The kernel that made two runs differ (LayerNormGrad's thread-order sum) is checked on its own
in tests/test_cpu_kernels.py.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from train_helpers import make_run, saved_weights, write_tiny_model  # first: tasks on the path
from tasks.errors import PREEMPTED_EXIT_CODE  # noqa: E402
from tasks.runs.runlayout import read_manifest  # noqa: E402

NOTICE_AT = 11
ROWS = 112  # / 16 = 7 steps an epoch, 2 epochs: steps 11 and 13 are mid-epoch (the second)
SETTINGS = dict(per_replica_batch_size=16, epochs=2, learning_rate=1e-2, warmup_ratio=0.25,
                weight_decay=0.01, checkpoint_every_steps=100, strategy="one_device",
                mixed_precision="mixed_bfloat16", deterministic=True,
                evaluate_in_train=False)  # the weights are compared, not test metrics


@pytest.fixture(scope="module")
def dropout_model(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-model"), hidden_size=64,
                            intermediate_size=128, hidden_dropout_prob=0.1,
                            attention_probs_dropout_prob=0.1)


def train_in_fresh_process(ctx, sigterm_at: int = 0) -> subprocess.CompletedProcess:
    """The train step in a new process; with `sigterm_at`, the process sends itself SIGTERM
    once that step is done (the train step's own handler saves it and exits 75)."""
    return subprocess.run([sys.executable, __file__, ctx.run_uri, str(sigterm_at)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TF_USE_LEGACY_KERAS": "1"})


def train_concurrently(*calls: tuple) -> list[subprocess.CompletedProcess]:
    """train_in_fresh_process(*args) for each of `calls`, all at once: independent runs,
    overlapped (a process spends most of its time starting up)."""
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda args: train_in_fresh_process(*args), calls))


def trained(ctx) -> tuple[dict, dict]:
    manifest = read_manifest(ctx.manifest_uri("train"))
    return manifest, saved_weights(Path(manifest["model_dir"]))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, dropout_model) -> dict:
    """Three runs of one seed started together, each in its own fresh process: "ref" and
    "again" uninterrupted, "stopped" sent SIGTERM at step NOTICE_AT (its first attempt; the
    test resumes it). Name -> (ctx, that process)."""
    ctxs = {name: make_run(tmp_path_factory.mktemp(name), dropout_model, ROWS, 16,
                           **SETTINGS)[1] for name in ("ref", "again", "stopped")}
    done = train_concurrently((ctxs["ref"],), (ctxs["again"],),
                              (ctxs["stopped"], NOTICE_AT))
    return {name: (ctx, proc) for (name, ctx), proc in zip(ctxs.items(), done)}


@pytest.fixture(scope="module")
def reference(runs):
    """The uninterrupted deterministic run: (manifest, weights)."""
    ctx, done = runs["ref"]
    assert done.returncode == 0, done.stderr[-3000:]
    return trained(ctx)


def assert_same_bits(a: dict, b: dict, base: dict) -> None:
    assert a.keys() == b.keys() and len(a) > 30
    assert max(float(np.abs(a[k] - base[k]).max()) for k in a) > 1e-2  # it trained
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_two_deterministic_runs_end_with_bitwise_equal_weights(dropout_model, runs,
                                                               reference):
    ref_manifest, ref_weights = reference
    assert ref_manifest["deterministic"] is True
    assert ref_manifest["mixed_precision"] == "mixed_bfloat16"
    assert ref_manifest["cpu_kernels"] is True  # built by make install
    ctx, done = runs["again"]
    assert done.returncode == 0, done.stderr[-3000:]
    manifest, weights = trained(ctx)
    assert manifest["steps"] == ref_manifest["steps"] == 14
    assert_same_bits(weights, ref_weights, saved_weights(dropout_model))


def test_a_deterministic_run_sigtermed_at_step_11_resumes_to_the_same_bits(
        dropout_model, runs, reference):
    ctx, done = runs["stopped"]
    assert done.returncode == PREEMPTED_EXIT_CODE, done.stdout[-2000:] + done.stderr[-3000:]
    record = json.loads((Path(ctx.step_uri("train")) / "preemption" / "chief-0.json")
                        .read_text())
    assert record["step"] == NOTICE_AT and record["signal"] == "SIGTERM"

    done = train_in_fresh_process(ctx)  # the next attempt
    assert done.returncode == 0, done.stderr[-3000:]
    manifest, weights = trained(ctx)
    assert manifest["resumed_from_step"] == NOTICE_AT and manifest["steps"] == 14
    assert manifest["deterministic"] is True
    assert_same_bits(weights, reference[1], saved_weights(dropout_model))
    history = json.loads((Path(ctx.step_uri("train")) / "history.json").read_text())
    steps = [r["step"] for r in history["records"]]
    assert steps == sorted(set(steps)) and steps[-1] == 14


@pytest.mark.parametrize("task, loop", [("multi_label", "fit"), ("regression", "custom")])
def test_the_other_tasks_resume_to_the_same_bits(tmp_path, dropout_model, task, loop):
    """Exact resume for every task: multi-label (fit) and regression (the custom loop with
    gradient accumulation) sent SIGTERM at step 13, mid-epoch, end with an uninterrupted
    run's bits (token classification: tests/test_token_strategies.py)."""
    settings = {**SETTINGS, "task": task, "training_loop": loop,
                **({"grad_accum_steps": 2, "per_replica_batch_size": 8} if loop == "custom"
                   else {})}
    runs = [make_run(tmp_path / name, dropout_model, ROWS, 16, **settings)[1]
            for name in ("ref", "run")]
    ref_done, done = train_concurrently((runs[0],), (runs[1], 13))
    assert ref_done.returncode == 0, ref_done.stderr[-3000:]
    assert done.returncode == PREEMPTED_EXIT_CODE, done.stdout[-2000:] + done.stderr[-3000:]
    done = train_in_fresh_process(runs[1])
    assert done.returncode == 0, done.stderr[-3000:]
    (ref_manifest, ref_weights), (manifest, weights) = map(trained, runs)
    assert manifest["task"] == task and manifest["resumed_from_step"] == 13
    assert manifest["steps"] == ref_manifest["steps"] == 14
    assert_same_bits(weights, ref_weights, saved_weights(dropout_model))


def main(run_dir: str, sigterm_at: int) -> None:
    from tasks.runs.runlayout import RunContext, read_run_config
    from tasks.steps import train

    cfg = read_run_config(f"{run_dir}/config.json")
    ctx = RunContext(**json.loads(Path(run_dir, "context.json").read_text()))
    if sigterm_at:
        step_done = train.Progress.step_done

        def notice(self, at, metrics):
            step_done(self, at, metrics)
            if at == sigterm_at:
                os.kill(os.getpid(), signal.SIGTERM)  # the handler train.run installed

        train.Progress.step_done = notice
    train.run(cfg, ctx)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
