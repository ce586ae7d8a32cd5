"""Scheduled retraining warm-starts from the live model: a first run trains, evaluates,
exports and is promoted; a second run with `base_model: champion` starts from that version's
Hugging Face checkpoint and, before its first training step, evaluates at or above the
champion's accuracy. All real steps, on the tiny random BERT and tiny data of
tests/train_helpers.py (local disk; the storage backends are under test elsewhere)."""
from __future__ import annotations

import numpy as np

from tasks.config import RunConfig
from tasks.io import storage
from tasks.io.uris import sha256_file
from tasks.runs import runlayout
from tasks.runs.runlayout import RunContext, write_manifest, write_run_config
from tasks.steps import export, promote
from tasks.training import checkpoint, checkpoint_sources
from train_helpers import (LABELS, make_run, run_steps_in_subprocess, single_device_matrix,
                           tiny_model_dir, write_tokenized)  # noqa: F401  (fixture)


def accuracy(matrix) -> float:
    matrix = np.asarray(matrix)
    return float(np.trace(matrix) / matrix.sum())


def data_manifest(ctx: RunContext) -> None:
    write_manifest(ctx.step_uri("data"), {
        "labels": LABELS, "has_pair": False, "eval_source": "file",
        "sources": {"train": {"uri": "tiny://train", "sha256": "0" * 64}, "eval": None}})


def test_second_run_starts_at_the_champions_accuracy(tmp_path, tiny_model_dir,  # noqa: F811
                                                     monkeypatch):
    monkeypatch.setenv("BERTFLOW_CHECKPOINT_CACHE", str(tmp_path / "cache"))
    checkpoint_sources._resolved.clear()
    cfg, ctx = make_run(tmp_path / "root", tiny_model_dir, epochs=2, model_name="tiny")
    data_manifest(ctx)
    done = run_steps_in_subprocess(ctx.run_uri, "train", "evaluate", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    trained = runlayout.read_manifest(ctx.manifest_uri("train"))
    assert trained["base_checkpoint"]["kind"] == "local"
    assert trained["base_checkpoint"]["sha256"] == sha256_file(
        tiny_model_dir / "model.safetensors")
    export.run(cfg, ctx)
    assert runlayout.read_manifest(promote.run(cfg, ctx))["promoted"]
    champion = storage.read_json(promote.champion_uri(cfg))
    assert champion["value"] > 0.7  # learned something: the warm start has something to keep

    second = cfg.model_copy(update={"base_model": "champion"})
    pinned = checkpoint_sources.check(second)  # what validate does
    assert pinned == f"champion:tiny@{champion['version']}"
    second = second.model_copy(update={"base_model": pinned})
    ctx2 = RunContext(artifact_root=cfg.artifact_root, dag_id="test", run_key="run2")
    write_run_config(ctx2, second)
    write_tokenized(ctx2, 128, 41, max_seq_length=second.max_seq_length)
    resolved = checkpoint.resolve_base_checkpoint(second)
    assert (resolved.kind, resolved.revision) == ("champion", champion["version"])
    assert resolved.location == champion["version_uri"]
    assert resolved.weights == "model.safetensors"  # the version's Hugging Face checkpoint
    assert "reused (labels" in checkpoint.describe_head(resolved.path, LABELS)

    before_training = accuracy(single_device_matrix(resolved.path, ctx2))
    assert before_training >= champion["value"] - 1e-9, (before_training, champion)
