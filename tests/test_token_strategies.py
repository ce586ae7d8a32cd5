"""Token classification under the distributed strategies, on loopback processes (the local
provisioner's LocalCluster), with the tiny random BERT (dropout 0.1) and the tiny tagged rows
of tests/train_helpers.py (a tag per word, IGNORED on [CLS]/[SEP]).

- The custom loop with gradient accumulation under 2-worker MultiWorkerMirrored trains the
  same weights as Mirrored in one process (same per-replica pipelines and dropout seeds): the
  loss divides every piece by the step's labelled pieces summed over micro-batches and
  replicas on both.
- Its distributed evaluation gathers every sentence once: the entity counts equal one
  device's over the same checkpoint, and a padded-to-max_seq_length (TPU) input pipeline
  counts the same.
- A SIGTERM mid-epoch saves at one step boundary and the resumed run ends bitwise equal to an
  uninterrupted one.
- ParameterServer trains through Model.fit with the token loss and evaluates on the chief.
"""
from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import numpy as np
import pytest

from tasks.runs.runlayout import read_manifest
from test_preemption import attempt, preemption_records, signal_at
from train_helpers import (TAGS, make_run, run_cluster, run_steps_in_subprocess, saved_weights,
                           write_tiny_model)

NUM_TRAIN, NUM_EVAL, NUM_VALIDATION = 64, 41, 24
FIXED = (10, 10)  # words per training row: one batch shape, one trace
COMMON = dict(task="token_classification", training_loop="custom", grad_accum_steps=2,
              per_replica_batch_size=4, epochs=4, eval_batch_size=8, learning_rate=1e-2,
              warmup_ratio=0.25, weight_decay=0.01, checkpoint_every_steps=4)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-model"), hidden_dropout_prob=0.1,
                            attention_probs_dropout_prob=0.1)


def one_device_tags(ctx, model_dir: Path, static_shapes: bool = False, split: str = "eval"):
    """The reference: the checkpoint's (true, predicted) tags of every sentence of `split` on
    one device in this process."""
    import tensorflow as tf
    import tf_keras

    from tasks.steps import evaluate
    from tasks.training import checkpoint, inputs

    tf_keras.mixed_precision.set_global_policy("float32")
    tok = read_manifest(ctx.manifest_uri("tokenize"))
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = checkpoint.load_classifier(model_dir, TAGS, head="token_classification")
    with inputs.local_shards(tok, split) as files:
        return evaluate.gathered_tags(strategy, model, files, 8, static_shapes,
                                      tok["max_seq_length"], tok["label_spec"])


def test_mwms_with_accumulation_trains_and_counts_as_mirrored(tmp_path, tiny_model):
    from tasks.training import entity_metrics

    # Validation every 4 steps, the best checkpoint exported (tasks/training/validation.py).
    # 2 epochs of 4 steps: two validations, and equal weights need no more steps.
    validated = dict(num_validation=NUM_VALIDATION, eval_every_steps=4,
                     **{**COMMON, "epochs": 2})
    mirrored = make_run(tmp_path / "mirrored", tiny_model, NUM_TRAIN, NUM_EVAL, FIXED,
                        strategy="mirrored", devices_per_worker=2, **validated)
    mwms = make_run(tmp_path / "mwms", tiny_model, NUM_TRAIN, NUM_EVAL, FIXED,
                    strategy="multi_worker_mirrored", num_workers=2, **validated)
    done = {}
    thread = threading.Thread(target=lambda: done.setdefault(
        "mirrored", run_steps_in_subprocess(mirrored[1].run_uri, "train", "evaluate")))
    thread.start()
    try:
        run_cluster(*mwms, "train")
        run_cluster(*mwms, "evaluate")
    finally:
        thread.join()
    assert done["mirrored"].returncode == 0, done["mirrored"].stderr[-3000:]

    a, b = (read_manifest(ctx.manifest_uri("train")) for _, ctx in (mirrored, mwms))
    for manifest in (a, b):
        assert manifest["task"] == "token_classification"
        assert (manifest["num_replicas"], manifest["global_batch_size"]) == (2, 16)
        assert manifest["steps"] == 8
    wa, wb = saved_weights(Path(a["model_dir"])), saved_weights(Path(b["model_dir"]))
    base = saved_weights(tiny_model)
    assert max(float(np.abs(wa[k] - base[k]).max()) for k in base  # the encoder moved
               if k in wa and wa[k].shape == base[k].shape) > 1e-2
    assert max(float(np.abs(wa[k] - wb[k]).max()) for k in wa) <= 1e-5

    for (_, ctx), manifest in ((mirrored, a), (mwms, b)):
        metrics = json.loads(Path(read_manifest(ctx.manifest_uri("evaluate"))["metrics_uri"])
                             .read_text())
        truth, predicted = one_device_tags(ctx, Path(manifest["model_dir"]))
        assert len(truth) == metrics["num_examples"] == NUM_EVAL
        counts = entity_metrics.count_entity_ids(truth, predicted, TAGS)
        assert metrics["per_type"]["UP"]["support"] == int(counts[0, 0])
        assert metrics["per_type"]["UP"]["correct"] == int(counts[0, 2])
        assert metrics["f1"] == pytest.approx(
            entity_metrics.entity_scores(counts, ["UP"])["f1"])
    # Both evaluated the validation sentences at the same steps, to the same figures, and
    # exported the best step's weights: one device scores them to the recorded best.
    curves = [json.loads((Path(ctx.step_uri("train")) / "history.json").read_text())
              ["validation"] for _, ctx in (mirrored, mwms)]
    assert [r["step"] for r in curves[0]] == [r["step"] for r in curves[1]] == [4, 8]
    for ra, rb in zip(*curves):
        assert ra["f1"] == pytest.approx(rb["f1"], abs=1e-9)
    assert a["validation"]["best_step"] == b["validation"]["best_step"]
    truth, predicted = one_device_tags(mwms[1], Path(b["model_dir"]), split="validation")
    assert len(truth) == NUM_VALIDATION
    f1 = entity_metrics.entity_scores(entity_metrics.count_entity_ids(truth, predicted, TAGS),
                                      ["UP"])["f1"]
    assert f1 == pytest.approx(b["validation"]["best_value"], abs=1e-9)
    # The TPU input path (rows padded to max_seq_length, filler rows) counts the same.
    static = one_device_tags(mwms[1], Path(b["model_dir"]), static_shapes=True)
    dynamic = one_device_tags(mwms[1], Path(b["model_dir"]))
    keep = static[0] != -100
    assert sorted(map(tuple, np.where(keep, static[1], -1).tolist())) == \
        sorted(map(tuple, np.where(dynamic[0] != -100, dynamic[1], -1).tolist()))


def test_sigterm_mid_epoch_resumes_bitwise(tmp_path, tiny_model):
    # With validation every 4 steps: the best-so-far state (value, step, weights) resumes
    # too, so the best checkpoint exported is the uninterrupted run's. No test evaluation
    # after training: bits and validation curves are compared.
    settings = dict(strategy="multi_worker_mirrored", num_workers=2, eval_every_steps=4,
                    num_validation=NUM_VALIDATION, evaluate_in_train=False,
                    **{**COMMON, "epochs": 2, "grad_accum_steps": 1})
    ref = make_run(tmp_path / "ref", tiny_model, 128, 16, FIXED, **settings)
    run = make_run(tmp_path / "run", tiny_model, 128, 16, FIXED, **settings)
    ref_result: list = []
    reference = threading.Thread(target=lambda: ref_result.append(attempt(*ref, 1, [])))
    reference.start()
    lines: list[str] = []
    when = signal_at(9, "worker", 0, signal.SIGTERM)  # logged every 3; 16 steps per epoch
    try:
        cluster, err = attempt(*run, 1, lines, when)
    finally:
        reference.join()
    assert when.sent.is_set() and cluster.outcome == "preempted", "\n".join(lines[-30:])
    step = {r["step"] for r in preemption_records(run[1]).values()}
    assert len(step) == 1 and 9 <= min(step) < 16
    _, err = attempt(*run, 2, lines)
    assert err is None and ref_result[0][1] is None, str(err or ref_result[0][1])
    manifest = read_manifest(run[1].manifest_uri("train"))
    assert manifest["resumed_from_step"] == min(step) and manifest["steps"] == 32
    reference = read_manifest(ref[1].manifest_uri("train"))
    a = saved_weights(Path(manifest["model_dir"]))
    b = saved_weights(Path(reference["model_dir"]))
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    best = {k: manifest["validation"][k] for k in ("best_step", "best_value")}
    assert best == {k: reference["validation"][k] for k in best}
    curves = [json.loads((Path(ctx.step_uri("train")) / "history.json").read_text())
              ["validation"] for ctx in (run[1], ref[1])]
    assert [(r["step"], r["f1"]) for r in curves[0]] == [(r["step"], r["f1"]) for r in curves[1]]


def test_parameter_server_trains_tokens_with_fit(tmp_path, tiny_model):
    # A checkpoint every 16 of the 32 steps, not every 4: each parameter-server checkpoint
    # (and the fit call it ends) took ~4.5 s; one still falls mid-run.
    cfg, ctx = make_run(tmp_path, tiny_model, NUM_TRAIN, NUM_EVAL, FIXED,
                        strategy="parameter_server", num_workers=2, num_ps=1,
                        **{**COMMON, "training_loop": "fit", "grad_accum_steps": 1,
                           "epochs": 2, "checkpoint_every_steps": 16})
    run_cluster(cfg, ctx, "train")
    manifest = read_manifest(ctx.manifest_uri("train"))
    assert manifest["strategy"] == "parameter_server" and manifest["task"] == \
        "token_classification"
    assert manifest["steps"] == manifest["total_steps"] > 0
    assert np.isfinite(manifest["final_loss"]) and manifest["final_loss"] < np.log(3)
    lines = run_cluster(cfg, ctx, "evaluate")
    result = read_manifest(ctx.manifest_uri("evaluate"))
    assert result["num_examples"] == NUM_EVAL and set(result["metrics"]) == {
        "f1", "macro_f1", "precision", "recall"}
    assert any(ln.startswith("[chief:0] evaluate: f1") for ln in lines)
