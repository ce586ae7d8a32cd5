"""tasks/training/seeded_dropout.py: dropout masks from (seed, step, layer, replica).

- A one-device run with dropout, preempted mid-epoch (a real SIGTERM to this process, taken by
  the train step's own handler) and resumed from its checkpoint, ends with the weights of an
  uninterrupted run, bit for bit: under fit on the CPU kernels and under the custom loop with
  gradient accumulation on TensorFlow's ops. With masks from a stateful RNG (Keras' dropout)
  the resumed run draws other masks and ends elsewhere.
- Layers, steps, micro-batches and replicas (2 logical CPUs under Mirrored, in a fresh
  process) draw different masks; the same (step, layer, replica) draws the same mask.
Multi-process exact resume with dropout: tests/test_preemption.py.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from train_helpers import saved_weights, make_run, write_tiny_model  # first: puts tasks on the path
from tasks.runs.runlayout import read_manifest  # noqa: E402
from tasks.steps import train  # noqa: E402
from tasks.training import preemption  # noqa: E402

# 128 rows / 16 = 8 steps per epoch, 2 epochs; the notice at step 5 lands mid-epoch.
COMMON = dict(per_replica_batch_size=16, epochs=2, learning_rate=1e-2, warmup_ratio=0.25,
              weight_decay=0.01, checkpoint_every_steps=100)
NOTICE_AT = 5


@pytest.fixture(autouse=True)
def float32_policy_afterwards():
    yield
    import tf_keras

    tf_keras.mixed_precision.set_global_policy("float32")


@pytest.fixture(scope="module")
def dropout_model(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-model"), hidden_dropout_prob=0.1,
                            attention_probs_dropout_prob=0.1)


class Exited(Exception):
    pass


def train_preempted_at(cfg, ctx, step: int, monkeypatch) -> None:
    """Run the train step, SIGTERM this process once step `step` is logged; the step saves and
    would exit 75 (here: raises Exited)."""
    step_done = train.Progress.step_done

    def notice(self, at, metrics):
        step_done(self, at, metrics)
        if at == step:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler train.run installed

    def exit_preempted():
        raise Exited

    with monkeypatch.context() as patch:
        patch.setattr(train.Progress, "step_done", notice)
        patch.setattr(preemption, "exit_preempted", exit_preempted)
        with pytest.raises(Exited):
            train.run(cfg, ctx)
    record = json.loads((Path(ctx.step_uri("train")) / "preemption" / "chief-0.json")
                        .read_text())
    assert record["step"] == step and record["signal"] == "SIGTERM"


@pytest.mark.parametrize("loop,kernels,accumulate", [("fit", True, 1), ("custom", False, 2)])
def test_resumed_run_with_dropout_ends_with_the_uninterrupted_weights(
        tmp_path, dropout_model, monkeypatch, loop, kernels, accumulate):
    from tasks.model import cpu_kernels

    if not kernels:
        monkeypatch.setenv("BERTFLOW_CPU_KERNELS", "0")
    cpu_kernels.library.cache_clear()
    try:
        settings = dict(COMMON, training_loop=loop, grad_accum_steps=accumulate,
                        per_replica_batch_size=16 // accumulate)
        ref_cfg, ref_ctx = make_run(tmp_path / "ref", dropout_model, 128, 16, **settings)
        train.run(ref_cfg, ref_ctx)
        cfg, ctx = make_run(tmp_path / "run", dropout_model, 128, 16, **settings)
        train_preempted_at(cfg, ctx, NOTICE_AT, monkeypatch)
        train.run(cfg, ctx)
    finally:
        monkeypatch.delenv("BERTFLOW_CPU_KERNELS", raising=False)
        cpu_kernels.library.cache_clear()
    manifest = read_manifest(ctx.manifest_uri("train"))
    reference = read_manifest(ref_ctx.manifest_uri("train"))
    assert manifest["resumed_from_step"] == NOTICE_AT and manifest["steps"] == 16
    assert manifest["cpu_kernels"] is reference["cpu_kernels"] is kernels
    assert manifest["training_loop"] == loop
    a, b = saved_weights(Path(manifest["model_dir"])), saved_weights(Path(reference["model_dir"]))
    base = saved_weights(dropout_model)
    assert a.keys() == b.keys() and len(a) > 30
    assert max(float(np.abs(a[k] - base[k]).max()) for k in a) > 1e-2  # it trained
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


# Run in a fresh process (`python tests/test_seeded_dropout.py`): 2 logical CPUs must be set
# before TensorFlow starts. Prints the keep masks as JSON.
def masks_under_mirrored() -> dict:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import tf_keras

    from tasks.model.layers import Dropout
    from tasks.model import cpu_kernels
    from tasks.training import seeded_dropout

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        step = tf.Variable(0, dtype=tf.int64)
        # The second on the CPU kernel: both ways of drawing take seeds.
        layers = tf_keras.Sequential([Dropout(0.5, 0), Dropout(0.5, 1, cpu_kernels.available())])
    seeds = seeded_dropout.DropoutSeeds(7, step, 2)
    for layer in layers.layers:
        layer.set_seeds(seeds)
    x = tf.ones([32, 32])

    @tf.function
    def forward(micro):
        def replica():
            with seeded_dropout.micro_batch(micro):
                return [tf.cast(layer(x, training=True) != 0, tf.int32) for layer in layers.layers]
        return strategy.run(replica)

    out = {}
    for at, micro in ((0, 0), (0, 1), (1, 0), (0, 0)):
        step.assign(at)
        per_layer = forward(tf.constant(micro))
        out.setdefault(f"{at}/{micro}", []).append(
            [[r.numpy().tolist() for r in strategy.experimental_local_results(m)]
             for m in per_layer])
    out["kernel_layer"] = layers.layers[1].use_cpu_kernel
    return out


def test_layers_steps_micro_batches_and_replicas_draw_their_own_masks():
    done = subprocess.run([sys.executable, __file__], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TF_USE_LEGACY_KERAS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["kernel_layer"] is True  # built by make install
    first, again = (np.array(m) for m in out["0/0"])  # [layer, replica, 32, 32]
    np.testing.assert_array_equal(first, again)  # the same step draws the same masks
    assert 0.4 < first.mean() < 0.6
    masks = [first[layer, replica] for layer in range(2) for replica in range(2)]
    masks += [np.array(out[key][0])[layer, replica] for key in ("0/1", "1/0")
              for layer in range(2) for replica in range(2)]
    for i, a in enumerate(masks):  # 12 masks of 1024 draws: no two alike
        for b in masks[i + 1:]:
            assert 0.3 < (a != b).mean() < 0.7


if __name__ == "__main__":
    print(json.dumps(masks_under_mirrored()))
