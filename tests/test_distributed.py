"""Real multi-process training on loopback: the train and evaluate steps run as worker
processes started by the local provisioner (`LocalCluster` with the `WorkerSpec` the provision
step would write), on a tiny random BERT with dropout 0.1.

- multi_worker_mirrored (2 one-CPU workers) trains the same weights as mirrored (one process
  with 2 logical CPUs): same seed, same global batch of 2 x 8, the same per-replica
  input pipelines (replica/worker i reads shard i in the same seeded order) and the same
  dropout masks (seeded by the global replica id: tasks/training/seeded_dropout.py).
- parameter_server (chief + 2 workers + 1 ps) trains through Model.fit and evaluates inline
  on the chief.
- a 2-worker run loses a worker to SIGKILL after its first checkpoint, fails fast, and the
  retry resumes from the checkpoint and completes the plan.
- distributed evaluation (mirrored, 2-worker MWMS) counts exactly what one device counts, on
  an eval set (41 rows) that is not a multiple of the global batch (16).

One module-scoped fixture trains the mirrored and MWMS models once (concurrently); the other
tests reuse them.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tasks.errors import WorkerError
from tasks.provision.local.cluster import LocalCluster
from tasks.provision.spec import distributed_spec
from tasks.runs.runlayout import read_manifest, write_run_config
from train_helpers import (saved_weights, make_run, run_cluster, run_steps_in_subprocess,
                           single_device_matrix, write_tiny_model)

# Trained weights of the 2-worker MWMS run and the 2-device Mirrored run agree to within this
# (max absolute difference over every variable, after 24 AdamW steps at lr 1e-2, which move
# weights by ~1e-1). The two set-ups do the same arithmetic on the same batches; they could
# differ only where CPU kernels split work across threads differently or the all-reduce adds
# in another order (float32 rounding). Measured here: 0.0 (bitwise identical).
WEIGHT_ATOL = 1e-5
NUM_TRAIN, NUM_EVAL = 64, 41  # 41 eval rows: not a multiple of the global eval batch (16)
FIXED = (10, 10)  # words per training row: one batch shape, one trace of the train function
# 6 epochs of 4 steps: enough to make the model confident, so no prediction sits on a near-tie
# that float rounding (batches padded to different widths) could flip.
COMMON = dict(per_replica_batch_size=8, epochs=6, eval_batch_size=8, learning_rate=1e-2,
              warmup_ratio=0.25, weight_decay=0.01, checkpoint_every_steps=4)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-model"), hidden_dropout_prob=0.1,
                            attention_probs_dropout_prob=0.1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model) -> dict:
    """Mirrored (train + evaluate in one process) and 2-worker MWMS (train), concurrently."""
    root = tmp_path_factory.mktemp("runs")
    mirrored = make_run(root / "mirrored", tiny_model, NUM_TRAIN, NUM_EVAL, FIXED,
                        strategy="mirrored", devices_per_worker=2, **COMMON)
    mwms = make_run(root / "mwms", tiny_model, NUM_TRAIN, NUM_EVAL, FIXED,
                    strategy="multi_worker_mirrored", num_workers=2, **COMMON)
    results: dict = {}

    def mirrored_run():
        results["mirrored"] = run_steps_in_subprocess(mirrored[1].run_uri, "train", "evaluate")

    thread = threading.Thread(target=mirrored_run)
    thread.start()
    try:
        results["mwms_lines"] = run_cluster(*mwms, "train")
    finally:
        thread.join()
    done = results["mirrored"]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {"mirrored": mirrored, "mwms": mwms, "mwms_lines": results["mwms_lines"],
            "mirrored_stdout": done.stdout}


def test_mwms_trains_the_same_weights_as_mirrored(trained):
    mirrored = read_manifest(trained["mirrored"][1].manifest_uri("train"))
    mwms = read_manifest(trained["mwms"][1].manifest_uri("train"))
    assert mirrored["strategy"] == "mirrored" and mwms["strategy"] == "multi_worker_mirrored"
    for manifest in (mirrored, mwms):
        assert manifest["num_replicas"] == 2 and manifest["global_batch_size"] == 16
        assert manifest["steps"] == manifest["total_steps"] == 24  # 64 rows / 16 x 6 epochs
        assert manifest["resumed_from_step"] == 0
    # The start-of-training line shows how batch, learning rate and steps were derived.
    for out in (trained["mirrored_stdout"], "\n".join(trained["mwms_lines"])):
        assert ("2 replicas x 8 per replica x 1 accumulation = global batch 16; learning rate "
                "0.01 (none: no scaling) = 0.01; 4 steps per epoch, 24 steps in 6 epochs") in out

    a = saved_weights(Path(mirrored["model_dir"]))
    b = saved_weights(Path(mwms["model_dir"]))
    assert a.keys() == b.keys() and len(a) > 30
    base = saved_weights(Path(trained["mirrored"][0].base_model))
    moved = max(float(np.abs(a[k] - base[k]).max()) for k in a)
    diff = max(float(np.abs(a[k] - b[k]).max()) for k in a)
    print(f"MWMS vs mirrored: max |weight difference| {diff:.3g} (training moved weights by "
          f"up to {moved:.3g})")
    assert moved > 100 * WEIGHT_ATOL  # the comparison is not vacuous
    assert diff <= WEIGHT_ATOL


def test_distributed_evaluation_counts_exactly_what_one_device_counts(trained):
    # Mirrored: evaluated (2 replicas) in the fixture's process, right after training.
    _, ctx = trained["mirrored"]
    assert "on 41 examples" in trained["mirrored_stdout"]
    mirrored = json.loads(Path(read_manifest(ctx.manifest_uri("evaluate"))["metrics_uri"])
                          .read_text())
    reference = single_device_matrix(Path(read_manifest(ctx.manifest_uri("train"))["model_dir"]),
                                     ctx)
    assert reference.sum() == NUM_EVAL
    np.testing.assert_array_equal(mirrored["confusion_matrix"], reference)

    # MWMS: 2 workers, each evaluating its own shard (21 and 20 rows, batches of 8).
    cfg, ctx = trained["mwms"]
    lines = run_cluster(cfg, ctx, "evaluate")
    manifest = read_manifest(ctx.manifest_uri("evaluate"))
    assert manifest["strategy"] == "multi_worker_mirrored"
    mwms = json.loads(Path(manifest["metrics_uri"]).read_text())
    reference = single_device_matrix(Path(read_manifest(ctx.manifest_uri("train"))["model_dir"]),
                                     ctx)
    np.testing.assert_array_equal(mwms["confusion_matrix"], reference)
    assert mwms["num_examples"] == NUM_EVAL
    assert any(ln.startswith("[worker:0] evaluate: accuracy") for ln in lines)

    # The same model evaluated in one process of its own, outside its cluster (how bert_sweep
    # evaluates its best trial once the trial's workers are released): the same counts.
    write_run_config(ctx, cfg.model_copy(update={"evaluate_in_train": False}))
    try:
        done = run_steps_in_subprocess(ctx.run_uri, "evaluate")
    finally:
        write_run_config(ctx, cfg)
    assert done.returncode == 0, done.stderr[-3000:]
    alone = read_manifest(ctx.manifest_uri("evaluate"))
    assert (alone["strategy"], alone["evaluated_in"]) == ("one_device", "evaluate")
    np.testing.assert_array_equal(
        json.loads(Path(alone["metrics_uri"]).read_text())["confusion_matrix"], reference)


def test_parameter_server_trains_with_fit(tmp_path, tiny_model):
    # With validation every 3 steps: the chief evaluates inline between fit calls, which
    # end at each validation step as at each checkpoint (every 4).
    cfg, ctx = make_run(tmp_path, tiny_model, NUM_TRAIN, NUM_EVAL, FIXED,
                        strategy="parameter_server", num_workers=2, num_ps=1,
                        num_validation=24, eval_every_steps=3, **{**COMMON, "epochs": 2})
    lines = run_cluster(cfg, ctx, "train")
    manifest = read_manifest(ctx.manifest_uri("train"))
    evaluated = [int(ln.split("validation at step ")[1].split(":")[0]) for ln in lines
                 if ln.startswith("[chief:0] validation at step")]
    assert evaluated == [3, 6, 9, 12, 15, 16]  # and the last step
    assert not any("validation at" in ln for ln in lines if not ln.startswith("[chief:0]"))
    # The best step's weights were exported: one device scores them to the recorded best.
    matrix = single_device_matrix(Path(manifest["model_dir"]), ctx, split="validation")
    assert matrix.sum() == 24
    assert np.trace(matrix) / 24 == manifest["validation"]["best_value"]
    assert manifest["validation"]["exported"] == "best"
    assert manifest["strategy"] == "parameter_server" and manifest["training_loop"] == "fit"
    assert manifest["global_batch_size"] == 8 * manifest["num_replicas"]
    assert manifest["steps"] == manifest["total_steps"] > 0
    assert manifest["final_loss"] is not None and np.isfinite(manifest["final_loss"])
    assert (Path(manifest["model_dir"]) / "model.safetensors").is_file()
    assert (Path(manifest["checkpoint_dir"]) / "checkpoint").is_file()
    assert any(ln.startswith("[worker:1] serving as worker 1") for ln in lines)
    assert any(ln.startswith("[ps:0] serving as ps 0") for ln in lines)

    # Evaluation runs inline on the coordinator (see tasks/steps/evaluate.py for why).
    lines = run_cluster(cfg, ctx, "evaluate")
    result = read_manifest(ctx.manifest_uri("evaluate"))
    assert result["num_examples"] == NUM_EVAL and result["strategy"] == "parameter_server"
    assert any(ln.startswith("[chief:0] evaluate: accuracy") for ln in lines)


def test_killed_worker_fails_fast_and_the_retry_resumes(tmp_path, tiny_model):
    # 64 optimizer steps, a checkpoint every 4: plenty of training left after the first one.
    cfg, ctx = make_run(tmp_path, tiny_model, 128, NUM_EVAL, FIXED,
                        strategy="multi_worker_mirrored", num_workers=2,
                        **{**COMMON, "epochs": 8})
    record = tmp_path / "pids.json"
    index = Path(ctx.step_uri("train")) / "checkpoints" / "checkpoint"
    lines: list[str] = []
    outcome: dict = {}
    cluster = LocalCluster(distributed_spec(cfg, "train", ctx.run_uri), log=lines.append,
                           grace_seconds=30, record_uri=str(record))

    def attempt():
        try:
            cluster.run()
            outcome["error"] = None
        except WorkerError as err:
            outcome["error"] = err
            outcome["failed_at"] = time.monotonic()

    thread = threading.Thread(target=attempt)
    thread.start()
    deadline = time.monotonic() + 240
    while not index.is_file() and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert index.is_file(), "no checkpoint was written:\n" + "\n".join(lines[-40:])
    pids = {(p["role"], p["index"]): p["pid"] for p in json.loads(record.read_text())["pids"]}
    os.kill(pids[("worker", 1)], signal.SIGKILL)
    killed_at = time.monotonic()
    thread.join(timeout=120)
    assert not thread.is_alive()

    err = outcome["error"]
    assert err is not None, "training finished before the kill:\n" + "\n".join(lines[-20:])
    assert "worker:1 exited with code -9" in str(err)
    assert outcome["failed_at"] - killed_at < 30  # fail fast, not a collective timeout
    for pid in pids.values():  # the provisioner stopped the surviving worker
        assert not Path(f"/proc/{pid}").exists() or \
            Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    assert not Path(ctx.manifest_uri("train")).exists()

    # The retry (as Airflow would run it): same step, same run folder.
    lines = run_cluster(cfg, ctx, "train")
    manifest = read_manifest(ctx.manifest_uri("train"))
    assert manifest["resumed_from_step"] > 0 and manifest["resumed_from_step"] % 4 == 0
    assert manifest["steps"] == manifest["total_steps"] == 64
    for worker in ("[worker:0]", "[worker:1]"):  # both workers resumed from the same step
        assert any(ln.startswith(f"{worker} train: resuming from step "
                                 f"{manifest['resumed_from_step']}") for ln in lines), lines


def test_regression_under_two_worker_mwms_gathers_every_eval_pair_once(tmp_path, tiny_model):
    """Regression trained and evaluated by 2 MultiWorkerMirrored workers: the evaluation
    gathers the (label, prediction) pairs of both workers' replicas (uneven: 41 rows in
    global batches of 16), so its MSE, Pearson and Spearman equal one device's over the
    same checkpoint."""
    import tf_keras
    import tensorflow as tf

    from tasks.steps import evaluate
    from tasks.task_kinds import regression_metrics
    from tasks.training import checkpoint, inputs

    cfg, ctx = make_run(tmp_path, tiny_model, NUM_TRAIN, NUM_EVAL, FIXED, task="regression",
                        strategy="multi_worker_mirrored", num_workers=2, training_loop="custom",
                        **COMMON)
    run_cluster(cfg, ctx, "train")
    run_cluster(cfg, ctx, "evaluate")
    trained = read_manifest(ctx.manifest_uri("train"))
    assert trained["task"] == "regression" and trained["num_replicas"] == 2
    result = read_manifest(ctx.manifest_uri("evaluate"))
    metrics = json.loads(Path(result["metrics_uri"]).read_text())
    assert metrics["num_examples"] == NUM_EVAL

    tf_keras.mixed_precision.set_global_policy("float32")
    tok = read_manifest(ctx.manifest_uri("tokenize"))
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = checkpoint.load_classifier(Path(trained["model_dir"]), tok["labels"])
    with inputs.local_shards(tok, "eval") as files:
        one = regression_metrics(*evaluate.gathered_pairs(strategy, model, files, 8,
                                                          label_spec=tok["label_spec"]))
    print("2-worker MWMS", {k: metrics[k] for k in ("mse", "pearson", "spearman")},
          "one device", {k: one[k] for k in ("mse", "pearson", "spearman")})
    for name in ("mse", "pearson", "spearman"):
        assert metrics[name] == pytest.approx(one[name], abs=1e-6)
    assert metrics["pearson"] > 0.5


def test_multi_label_under_parameter_server_trains_and_counts_every_eval_row(tmp_path,
                                                                              tiny_model):
    """Multi-label under ParameterServer (fit, 2 workers, 1 ps): per-label sigmoid
    cross-entropy trains below chance, and the evaluation counts each of the 41 rows once."""
    cfg, ctx = make_run(tmp_path, tiny_model, NUM_TRAIN, NUM_EVAL, FIXED, task="multi_label",
                        strategy="parameter_server", num_workers=2, num_ps=1,
                        training_loop="fit", **COMMON)
    run_cluster(cfg, ctx, "train")
    run_cluster(cfg, ctx, "evaluate")
    trained = read_manifest(ctx.manifest_uri("train"))
    assert (trained["task"], trained["strategy"]) == ("multi_label", "parameter_server")
    assert trained["steps"] == trained["total_steps"] > 0
    assert np.isfinite(trained["final_loss"]) and trained["final_loss"] < np.log(2)
    result = read_manifest(ctx.manifest_uri("evaluate"))
    metrics = json.loads(Path(result["metrics_uri"]).read_text())
    assert metrics["num_examples"] == NUM_EVAL and metrics["task"] == "multi_label"
    assert set(result["metrics"]) == {"micro_f1", "macro_f1", "subset_accuracy"}
    # every row has one of the two labels: the per-label supports cover all 41 rows
    assert sum(m["support"] for m in metrics["per_label"].values()) >= NUM_EVAL
