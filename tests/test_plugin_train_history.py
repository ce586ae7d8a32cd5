"""train/history.json: what the train step records for the bertflow page to draw without
TensorFlow, on local, gs:// and s3:// run folders (real emulators on loopback), and a tiny real
training run that writes it."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from storage_servers import connections, gcs_emulator, root, s3_server  # noqa: F401
from tasks.runs import run_summary
from tasks.io import storage
from tasks.steps import train
from tasks.io.uris import join_uri
from tasks.runs.runlayout import read_manifest
from train_helpers import make_run, tiny_model_dir  # noqa: F401


@pytest.fixture(autouse=True)
def float32_policy_afterwards():
    """train.run sets the global Keras dtype policy; later tests in this process expect the
    default."""
    yield
    import tf_keras

    tf_keras.mixed_precision.set_global_policy("float32")


def metrics(step: int) -> dict:
    return {"loss": 1.0 / step, "accuracy": 0.5 + step / 100, "learning_rate": 1e-4}


def test_history_is_buffered_and_written_whole_at_epoch_ends(root, monkeypatch):
    uri = join_uri(root, "runs", "d", "k", "train", "history.json")
    writes = []
    real_write = storage.write_json
    monkeypatch.setattr(storage, "write_json", lambda u, obj: (writes.append(u),
                                                               real_write(u, obj)))
    plan = SimpleNamespace(total_steps=10, steps_per_epoch=4)
    history = train.History(uri, plan)
    for step in range(1, 11):
        history.step_done(step, metrics(step), elapsed=step * 0.5)
    assert writes == [uri] * 3  # after steps 4 and 8 (epoch ends) and 10 (the last)
    saved = storage.read_json(uri)
    assert saved["total_steps"] == 10 and saved["steps_per_epoch"] == 4
    assert [r["step"] for r in saved["records"]] == list(range(1, 11))
    assert saved["records"][3] == {"step": 4, "epoch": 1.0, "loss": 0.25, "accuracy": 0.54,
                                   "learning_rate": 1e-4, "elapsed_seconds": 2.0}

    # A retried train step resuming from the step-6 checkpoint keeps records 1..6 only.
    resumed = train.History(uri, plan, start_step=6)
    assert [r["step"] for r in resumed.records] == list(range(1, 7))
    for step in range(7, 11):
        resumed.step_done(step, metrics(step), elapsed=1.0)
    assert [r["step"] for r in storage.read_json(uri)["records"]] == list(range(1, 11))


def test_long_runs_keep_about_two_hundred_points():
    written = {}
    plan = SimpleNamespace(total_steps=10_007, steps_per_epoch=1000)
    history = train.History("unused", plan)
    history_write = storage.write_json
    try:
        storage.write_json = lambda uri, obj: written.update(obj)
        for step in range(1, plan.total_steps + 1):
            history.step_done(step, metrics(step), elapsed=0.0)
    finally:
        storage.write_json = history_write
    steps = [r["step"] for r in written["records"]]
    assert steps[0] == 1 and steps[-1] == 10_007 and 195 <= len(steps) <= 205
    assert written["every"] == 50


def test_tiny_training_run_writes_the_history_the_page_reads(tmp_path, tiny_model_dir):
    cfg, ctx = make_run(tmp_path, tiny_model_dir, num_train=64, epochs=2,
                        checkpoint_every_steps=100)
    train.run(cfg, ctx)
    manifest = read_manifest(ctx.manifest_uri("train"))
    saved = storage.read_json(join_uri(ctx.step_uri("train"), "history.json"))
    assert saved["total_steps"] == manifest["total_steps"] == 8  # 64 rows / 16 x 2 epochs
    records = saved["records"]
    assert [r["step"] for r in records] == list(range(1, 9))
    assert all(set(r) == {"step", "epoch", "loss", "accuracy", "learning_rate",
                          "elapsed_seconds"} for r in records)
    assert all(math.isfinite(r["loss"]) and 0 <= r["accuracy"] <= 1 for r in records)
    rates = [r["learning_rate"] for r in records]
    assert max(rates) <= manifest["learning_rate"] * 1.0001 and rates[-1] < max(rates)
    assert manifest["train_seconds"] > 0
    assert records[-1]["elapsed_seconds"] == pytest.approx(manifest["train_seconds"], abs=0.01)

    # What the page gets (tasks.runs.run_summary imports no TensorFlow).
    detail = run_summary.run_detail(str(tmp_path), ctx.dag_id, ctx.run_key)
    assert detail["history"] == records
    assert detail["train_seconds"] == manifest["train_seconds"]
