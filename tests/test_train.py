"""Training end to end on tiny data: fit and custom loops, OneDevice, Mirrored and
CentralStorage (2 logical CPUs, in a fresh process), mixed precision, checkpoints and resume,
and the manifests train/evaluate write. Multi-process strategies: tests/test_distributed.py."""
import json
import math
from pathlib import Path

import numpy as np
import pytest

from tasks.steps import evaluate, train
from tasks.runs.runlayout import read_manifest
from train_helpers import (LABELS, make_run, run_steps_in_subprocess,  # noqa: F401
                           saved_weights, tiny_model_dir, tiny_rows, write_tiny_model)


@pytest.fixture(autouse=True)
def float32_policy_afterwards():
    """train.run sets the global Keras dtype policy; later tests in this process expect the
    default."""
    yield
    import tf_keras

    tf_keras.mixed_precision.set_global_policy("float32")


def check_outputs(ctx, strategy, replicas, per_replica, checkpoint_every=10):
    manifest = read_manifest(ctx.manifest_uri("train"))
    assert manifest["strategy"] == strategy and manifest["num_replicas"] == replicas
    assert manifest["per_replica_batch_size"] == per_replica
    assert manifest["steps"] == manifest["total_steps"] == 24  # 128 rows / 16 x 3 epochs
    assert manifest["examples_per_second"] > 0
    assert manifest["final_loss"] < math.log(2)  # below chance level
    model_dir = Path(manifest["model_dir"])
    config = json.loads((model_dir / "config.json").read_text())
    assert config["id2label"] == {"0": "neg", "1": "pos"}
    assert {"model.safetensors", "vocab.txt"} <= {p.name for p in model_dir.iterdir()}
    # The periodic checkpoints only: a completed run saves its model, not a checkpoint.
    saved = sorted(int(index.name[len("ckpt-"):-len(".index")])
                   for index in Path(manifest["checkpoint_dir"]).glob("ckpt-*.index"))
    assert saved == list(range(checkpoint_every, 25, checkpoint_every))[-3:]  # 3 kept
    assert list(Path(manifest["tensorboard_dir"]).rglob("events.out.tfevents.*"))

    result = read_manifest(ctx.manifest_uri("evaluate"))
    assert result["num_examples"] == 41 and result["metrics"]["accuracy"] > 0.9
    # evaluated by the train step, in memory (evaluate_in_train), and published as is
    assert result["evaluated_in"] == "train" and result["strategy"] == strategy
    assert manifest["evaluation"]["num_examples"] == 41
    metrics = json.loads(Path(result["metrics_uri"]).read_text())
    assert sum(map(sum, metrics["confusion_matrix"])) == 41
    assert sum(c["support"] for c in metrics["per_class"].values()) == 41
    return manifest


def test_fit_on_one_device_learns(tmp_path, tiny_model_dir):
    cfg, ctx = make_run(tmp_path, tiny_model_dir)
    train.run(cfg, ctx)
    evaluate.run(cfg, ctx)
    manifest = check_outputs(ctx, "one_device", 1, 16)
    assert manifest["training_loop"] == "fit" and manifest["global_batch_size"] == 16
    assert manifest["cpu_kernels"] is True  # built by make install (tasks/model/cpu_kernels)


def test_without_cpu_kernels_training_falls_back_to_tensorflows_ops(tmp_path, tiny_model_dir,
                                                                   monkeypatch, capsys):
    """Where the kernels are not built (or BERTFLOW_CPU_KERNELS=0), the same run trains on
    TensorFlow's ops, and the log line and the manifest say so."""
    from tasks.model import cpu_kernels

    monkeypatch.setenv("BERTFLOW_CPU_KERNELS", "0")
    cpu_kernels.library.cache_clear()
    try:
        cfg, ctx = make_run(tmp_path, tiny_model_dir)
        train.run(cfg, ctx)
        evaluate.run(cfg, ctx)
    finally:
        monkeypatch.undo()
        cpu_kernels.library.cache_clear()
    manifest = check_outputs(ctx, "one_device", 1, 16)
    assert manifest["cpu_kernels"] is False
    assert "bertflow CPU kernels off" in capsys.readouterr().out


def test_mirrored_over_two_logical_cpus(tmp_path, tiny_model_dir):
    # 41 eval rows in batches of 8 per replica: the last global batch is partial and uneven.
    cfg, ctx = make_run(tmp_path, tiny_model_dir, devices_per_worker=2,
                        per_replica_batch_size=8)
    done = run_steps_in_subprocess(ctx.run_uri, "train", "evaluate")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "on 41 examples" in done.stdout
    manifest = check_outputs(ctx, "mirrored", 2, 8)
    assert manifest["global_batch_size"] == 16


def test_custom_loop_bfloat16_with_accumulation_resumes(tmp_path, tiny_model_dir):
    cfg, ctx = make_run(tmp_path, tiny_model_dir, training_loop="custom",
                        per_replica_batch_size=8, grad_accum_steps=2, max_steps=10,
                        checkpoint_every_steps=4, mixed_precision="mixed_bfloat16")
    train.run(cfg, ctx)
    first = read_manifest(ctx.manifest_uri("train"))
    assert (first["steps"], first["resumed_from_step"]) == (10, 0)
    assert first["global_batch_size"] == 16 and first["grad_accum_steps"] == 2

    # A restart with the full plan continues from the last checkpoint (step 8: the run
    # that ended at step 10 saved its model, not a checkpoint) instead of starting over.
    train.run(cfg.model_copy(update={"max_steps": 0}), ctx)
    evaluate.run(cfg, ctx)
    manifest = check_outputs(ctx, "one_device", 1, 8, checkpoint_every=4)
    assert manifest["resumed_from_step"] == 8 and manifest["training_loop"] == "custom"
    assert manifest["mixed_precision"] == "mixed_bfloat16"


def test_accumulated_micro_batches_equal_one_large_batch(tmp_path):
    import tensorflow as tf
    import tf_keras

    from tasks.training import checkpoint, model as model_lib
    from tasks.config import RunConfig

    tf_keras.mixed_precision.set_global_policy("float32")  # other tests may leave another
    model_dir = write_tiny_model(tmp_path / "model", hidden_dropout_prob=0.0,
                                 attention_probs_dropout_prob=0.0)
    rows = tiny_rows(16, seed=9, min_len=6, max_len=6)  # equal lengths: no padding
    data = tf.data.Dataset.from_tensor_slices((
        {"input_ids": np.array([r[0] for r in rows], np.int32),
         "token_type_ids": np.array([r[1] for r in rows], np.int32),
         "attention_mask": np.ones((16, 8), np.int32)},
        np.array([r[2] for r in rows], np.int32)))
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")

    def one_update(per_replica_batch, accum):
        cfg = RunConfig(per_replica_batch_size=per_replica_batch, grad_accum_steps=accum)
        plan = model_lib.make_plan(cfg, 16, 1)
        with strategy.scope():
            model = checkpoint.load_classifier(model_dir, LABELS)
            optimizer = tf_keras.optimizers.SGD(1.0)  # weight change == gradient
        step = train.make_train_step(strategy, model, optimizer, plan)
        batches = iter(strategy.experimental_distribute_dataset(data.batch(per_replica_batch)))
        loss, accuracy = step(batches)
        return float(loss), float(accuracy), [v.numpy() for v in model.trainable_variables]

    big = one_update(16, 1)
    accumulated = one_update(8, 2)
    assert accumulated[0] == pytest.approx(big[0], rel=1e-5)
    assert accumulated[1] == big[1]
    for a, b in zip(accumulated[2], big[2]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_fit_refuses_gradient_accumulation(tmp_path, tiny_model_dir):
    cfg, ctx = make_run(tmp_path, tiny_model_dir, grad_accum_steps=2)
    with pytest.raises(Exception, match="grad_accum_steps.*training_loop custom"):
        train.run(cfg, ctx)


def test_central_storage_trains_with_fit_over_two_logical_cpus(tmp_path, tiny_model_dir):
    # Variables live once on the host CPU, the 2 logical CPUs compute; AdamW with its LR
    # schedule and weight decay (see tasks.training.model.AdamW for what CentralStorage needed).
    cfg, ctx = make_run(tmp_path, tiny_model_dir, strategy="central_storage",
                        devices_per_worker=2, per_replica_batch_size=8, weight_decay=0.01)
    done = run_steps_in_subprocess(ctx.run_uri, "train", "evaluate")
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = check_outputs(ctx, "central_storage", 2, 8)
    assert manifest["training_loop"] == "fit" and manifest["global_batch_size"] == 16


# fit and the custom loop do the same arithmetic in a different order of operations; on one
# device, without dropout, their final weights agree to this (max absolute difference). The
# default gradient clipping divides every gradient by a norm summed in another order too:
# measured 1.3e-4 with it (below 1e-4 without), while training moves weights by ~1e-1.
LOOP_WEIGHT_ATOL = 3e-4


def test_fit_and_custom_loop_reach_the_same_model_each_tracing_its_step_once(tmp_path,
                                                                          monkeypatch):
    """Each loop traces its training step once: the optimizer's step counter and slots exist
    before the first step (tasks.training.model.create_slots). A first step that created
    them would be traced twice, with and without creating variables: a second trace and
    graph optimization of the whole step in every train process."""
    import tf_keras

    traces, made = [], []
    keras_step, make_step = tf_keras.Model.train_step, train.make_train_step
    monkeypatch.setattr(tf_keras.Model, "train_step",
                        lambda self, data: traces.append(1) or keras_step(self, data))
    monkeypatch.setattr(train, "make_train_step",
                        lambda *args, **kw: made.append(make_step(*args, **kw)) or made[-1])
    model_dir = write_tiny_model(tmp_path / "model", hidden_dropout_prob=0.0,
                                 attention_probs_dropout_prob=0.0)
    results = {}
    for loop in ("fit", "custom"):
        cfg, ctx = make_run(tmp_path / loop, model_dir, training_loop=loop, epochs=2,
                            weight_decay=0.01)
        train.run(cfg, ctx)
        evaluate.run(cfg, ctx)
        manifest = read_manifest(ctx.manifest_uri("train"))
        assert manifest["mixed_precision"] == "float32" and manifest["steps"] == 16
        if loop == "fit":
            assert (len(traces), made) == (1, [])
        else:
            assert len(traces) == 1  # fit's, none more
            assert [step.experimental_get_tracing_count() for step in made] == [1]
        metrics = json.loads(Path(read_manifest(ctx.manifest_uri("evaluate"))["metrics_uri"])
                             .read_text())
        results[loop] = manifest, metrics, saved_weights(Path(manifest["model_dir"]))
    (fit, fit_metrics, fit_w), (custom, custom_metrics, custom_w) = results["fit"], \
        results["custom"]
    diff = max(float(np.abs(fit_w[k] - custom_w[k]).max()) for k in fit_w)
    print(f"fit vs custom loop: max |weight difference| {diff:.3g}")
    assert diff <= LOOP_WEIGHT_ATOL
    assert custom["final_loss"] == pytest.approx(fit["final_loss"], rel=1e-3, abs=1e-4)
    assert custom_metrics["confusion_matrix"] == fit_metrics["confusion_matrix"]
    assert (custom_metrics["accuracy"], custom_metrics["macro_f1"]) == \
        (fit_metrics["accuracy"], fit_metrics["macro_f1"])


def test_custom_loop_with_loss_scaling_under_mixed_float16(tmp_path, tiny_model_dir):
    """float16 (auto's choice on GPUs) wraps the optimizer in a LossScaleOptimizer; the custom
    loop's scaled loss and unscaled, accumulated gradients still train (slowly, on the CPU)."""
    cfg, ctx = make_run(tmp_path, tiny_model_dir, mixed_precision="mixed_float16",
                        training_loop="custom", grad_accum_steps=2, per_replica_batch_size=8)
    train.run(cfg, ctx)
    manifest = read_manifest(ctx.manifest_uri("train"))
    assert manifest["mixed_precision"] == "mixed_float16" and manifest["steps"] == 24
    assert manifest["final_loss"] < math.log(2)  # below chance level


def test_fit_in_mixed_bfloat16_logs_the_plan(tmp_path, tiny_model_dir, capsys):
    # 2e-2 scaled by 16/32 trains at the 1e-2 the other tests use.
    cfg, ctx = make_run(tmp_path, tiny_model_dir, mixed_precision="mixed_bfloat16",
                        lr_scaling="linear", reference_batch_size=32, learning_rate=2e-2)
    train.run(cfg, ctx)
    evaluate.run(cfg, ctx)
    out = capsys.readouterr().out
    # Global batch, learning-rate scaling and steps per epoch: logged at start and recorded.
    assert ("1 replicas x 16 per replica x 1 accumulation = global batch 16; learning rate "
            "0.02 (linear: x 16/32) = 0.01; 8 steps per epoch, 24 steps in 3 epochs") in out
    assert "precision mixed_bfloat16" in out
    manifest = check_outputs(ctx, "one_device", 1, 16)
    assert manifest["mixed_precision"] == "mixed_bfloat16" and manifest["training_loop"] == "fit"
    assert (manifest["global_batch_size"], manifest["steps_per_epoch"]) == (16, 8)
    assert (manifest["base_learning_rate"], manifest["lr_scaling"]) == (0.02, "linear")
    assert manifest["learning_rate"] == pytest.approx(0.01)
    # Variables stay float32 under the mixed policy (bfloat16 is the compute type only).
    assert {w.dtype for w in saved_weights(Path(manifest["model_dir"])).values()} == \
        {np.dtype("float32")}



@pytest.mark.parametrize("task,loop", [("multi_label", "fit"), ("regression", "custom"),
                                       ("token_classification", "fit"),
                                       ("token_classification", "custom")])
def test_other_tasks_train_and_evaluate(tmp_path, tiny_model_dir, task, loop):
    """The other tasks on the same tiny data: multi-hot labels with per-label sigmoid
    cross-entropy, a score with squared error, a tag per word with token cross-entropy; both
    loops (the custom one with accumulation and bfloat16); exact metrics over the 41 eval
    rows."""
    extra = {"grad_accum_steps": 2, "per_replica_batch_size": 8,
             "mixed_precision": "mixed_bfloat16"} if loop == "custom" else {}
    if (task, loop) == ("token_classification", "fit"):
        extra["group_by_length"] = True  # the Param over the task's default (off)
    cfg, ctx = make_run(tmp_path, tiny_model_dir, task=task, training_loop=loop,
                        learning_rate=1e-2, epochs=6, **extra)
    train.run(cfg, ctx)
    evaluate.run(cfg, ctx)
    manifest = read_manifest(ctx.manifest_uri("train"))
    assert manifest["task"] == task and manifest["steps"] == 48
    assert manifest["group_by_length"] is extra.get("group_by_length", False)
    history = json.loads(Path(ctx.step_uri("train"), "history.json").read_text())
    metric = {"multi_label": "label_accuracy", "regression": "mse",
              "token_classification": "accuracy"}[task]
    assert all(metric in record for record in history["records"])
    config = json.loads(Path(manifest["model_dir"], "config.json").read_text())
    result = read_manifest(ctx.manifest_uri("evaluate"))
    metrics = json.loads(Path(result["metrics_uri"]).read_text())
    assert result["num_examples"] == metrics["num_examples"] == 41 and metrics["task"] == task
    print(task, {k: v for k, v in result["metrics"].items()}, "final loss",
          manifest["final_loss"])
    # Those metrics came from the train step's model in memory. The evaluate step, told
    # to load the saved model itself, counts exactly the same.
    assert result["evaluated_in"] == "train"
    evaluate.run(cfg.model_copy(update={"evaluate_in_train": False}), ctx)
    reloaded = read_manifest(ctx.manifest_uri("evaluate"))
    assert reloaded["evaluated_in"] == "evaluate" and reloaded["evaluation_seconds"] > 0
    assert json.loads(Path(reloaded["metrics_uri"]).read_text()) == metrics
    if task == "token_classification":
        assert config["architectures"] == ["BertForTokenClassification"]
        assert list(config["id2label"].values()) == ["O", "B-UP", "I-UP"]
        assert set(result["metrics"]) == {"f1", "macro_f1", "precision", "recall"}
        assert history["records"][-1]["accuracy"] > 0.85  # of the labelled pieces
        assert metrics["f1"] > 0.6, metrics  # exact spans: B- vs I- needs the context
        assert metrics["per_type"]["UP"]["support"] > 41  # several entities per sentence
    elif task == "multi_label":
        assert config["problem_type"] == "multi_label_classification"
        assert list(config["id2label"].values()) == ["lower", "upper"]
        assert manifest["final_loss"] < math.log(2)  # below chance for each label
        assert set(result["metrics"]) == {"micro_f1", "macro_f1", "subset_accuracy"}
        assert metrics["micro_f1"] > 0.9 and metrics["subset_accuracy"] > 0.8
        support = {label: m["support"] for label, m in metrics["per_label"].items()}
        assert support["lower"] + support["upper"] >= 41  # every row has a half
    else:
        assert config["problem_type"] == "regression" and config["id2label"] == {"0": "score"}
        assert set(result["metrics"]) == {"pearson", "spearman", "mse"}
        assert metrics["pearson"] > 0.8 and metrics["spearman"] > 0.8
        assert sum(row["count"] for row in metrics["binned"]["rows"]) == 41


def test_gradients_are_clipped_to_max_grad_norm(tmp_path, tiny_model_dir):
    """The default clips the step's gradient to global norm 1.0 (the Trainer's default): a
    tiny max_grad_norm bounds every update, so the weights barely move; 0 turns it off; the
    plan line and the manifest say which; central_storage cannot clip, so a value there is
    refused and the default is off."""
    from tasks.config import parse_config
    from tasks.errors import ConfigError

    moved = {}
    for name, clip in (("tiny", 1e-12), ("off", 0.0)):
        cfg, ctx = make_run(tmp_path / name, tiny_model_dir, epochs=1, max_grad_norm=clip,
                            learning_rate=1e-2, warmup_ratio=0.0)
        train.run(cfg, ctx)
        manifest = read_manifest(ctx.manifest_uri("train"))
        assert manifest["max_grad_norm"] == clip
        weights = saved_weights(Path(manifest["model_dir"]))
        base = saved_weights(tiny_model_dir)
        moved[name] = max(float(np.abs(weights[k] - base[k]).max()) for k in base)
    # Adam divides by sqrt(v) + epsilon (1e-8): a gradient clipped to norm 1e-12 is far below
    # epsilon, so each step is ~1e-4 of an unclipped one.
    print("max weight change: clipped to 1e-12", moved["tiny"], "unclipped", moved["off"])
    assert moved["tiny"] < 1e-3 * moved["off"]
    cfg, _ = make_run(tmp_path / "default", tiny_model_dir)
    assert train.clip_norm(cfg, "one_device") == 1.0
    assert train.clip_norm(cfg, "central_storage") == 0.0
    with pytest.raises(ConfigError, match="max_grad_norm"):
        parse_config({"strategy": "central_storage", "devices_per_worker": 2,
                      "max_grad_norm": 1.0})


def test_batches_group_by_length_by_default_only_for_classification():
    from tasks.config import RunConfig
    from tasks.task_kinds import kind

    defaults = {name: train.groups_by_length(RunConfig(), kind(name)) for name in (
        "classification", "multi_label", "regression", "token_classification")}
    assert defaults == {"classification": True, "multi_label": False, "regression": False,
                        "token_classification": False}
    assert train.groups_by_length(RunConfig(group_by_length=True), kind("multi_label"))
    assert not train.groups_by_length(RunConfig(group_by_length=False), kind("classification"))
