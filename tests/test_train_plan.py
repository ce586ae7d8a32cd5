"""Batch sizes, step counts, learning-rate scaling and schedule (no training)."""
import numpy as np
import pytest

from tasks.training import model
from tasks.config import RunConfig


def test_plan_counts_steps_from_the_global_batch():
    cfg = RunConfig(per_replica_batch_size=16, grad_accum_steps=2, epochs=3)
    plan = model.make_plan(cfg, num_train_examples=1000, num_replicas=4)
    assert plan.global_batch_size == 128 and plan.micro_batch_size == 64
    assert plan.steps_per_epoch == 8  # ceil(1000 / 128)
    assert plan.total_steps == 24 and plan.epochs == 3
    assert plan.warmup_steps == 2


def test_max_steps_caps_the_plan():
    cfg = RunConfig(per_replica_batch_size=10, epochs=5, max_steps=13)
    plan = model.make_plan(cfg, 100, 1)
    assert (plan.steps_per_epoch, plan.total_steps, plan.epochs) == (10, 13, 2)


@pytest.mark.parametrize("rule, factor", [("none", 1.0), ("linear", 4.0), ("sqrt", 2.0)])
def test_learning_rate_scales_with_global_batch(rule, factor):
    cfg = RunConfig(learning_rate=1e-4, lr_scaling=rule, reference_batch_size=32)
    assert model.scaled_learning_rate(cfg, 128) == pytest.approx(1e-4 * factor)


def test_schedule_warms_up_then_decays_to_zero():
    schedule = model.WarmUpSchedule(1.0, warmup_steps=10, total_steps=110)
    values = [float(schedule(step)) for step in (0, 5, 10, 60, 110, 200)]
    assert values == pytest.approx([0.0, 0.5, 1.0, 0.5, 0.0, 0.0])


def test_adamw_decays_kernels_but_not_biases_or_layer_norm():
    import tensorflow as tf
    import tf_keras

    cfg = RunConfig(weight_decay=0.1, learning_rate=0.5, warmup_ratio=0.0)
    optimizer = model.create_optimizer(cfg, model.make_plan(cfg, 100, 1), "float32")
    names = ["dense/kernel", "dense/bias", "LayerNorm/gamma"]
    variables = [tf.Variable([1.0], name=name) for name in names]
    optimizer.apply_gradients((tf.zeros([1]), v) for v in variables)  # decay only
    kernel, bias, gamma = (float(v.numpy()[0]) for v in variables)
    assert kernel < 1.0 and bias == 1.0 and gamma == 1.0
    loss_scaled = model.create_optimizer(cfg, model.make_plan(cfg, 100, 1), "mixed_float16")
    assert isinstance(loss_scaled, tf_keras.mixed_precision.LossScaleOptimizer)


def torch_adamw_step(p, g, m, v, t, lr, weight_decay, eps=1e-8, b1=0.9, b2=0.999):
    """One step of torch.optim.AdamW (decoupled weight decay, eps added to the bias-corrected
    sqrt(v)), as torch's documentation defines it, in numpy; returns (p, m, v)."""
    p = p * (1 - lr * weight_decay)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    denom = np.sqrt(v) / np.sqrt(1 - b2 ** t) + eps
    return p - lr / (1 - b1 ** t) * m / denom, m, v


@pytest.mark.parametrize("cpu_kernel", [False, True], ids=["tf_kernels", "bertflow_kernel"])
def test_adamw_takes_torch_adamw_steps_including_the_sparse_embedding_gradient(cpu_kernel):
    """Step for step torch's AdamW rule on the warm-up/decay schedule: the decay uses the
    scheduled rate, epsilon (torch's default 1e-8) is added to the bias-corrected sqrt(v).
    The gradients are small (1e-7), as many of BERT's are, so that Keras' epsilon (added to
    the uncorrected sqrt(v), 30x larger at the first step) would be far off. An
    IndexedSlices gradient (what an embedding gather gives) updates like its dense
    equivalent: repeated rows summed, rows without a gradient still decay. Both
    implementations: TensorFlow's kernels and bertflow's one-pass CPU kernel."""
    import tensorflow as tf

    from tasks.model import cpu_kernels
    if cpu_kernel and not cpu_kernels.available():
        pytest.fail("bertflow CPU kernels not built: run `make install`")

    peak, wd, scale = 0.1, 0.2, 1e-7
    schedule = model.WarmUpSchedule(peak, warmup_steps=2, total_steps=6)
    optimizer = model.AdamW(learning_rate=schedule, weight_decay=wd, epsilon=1e-8,
                            exclude_from_weight_decay=model.NO_DECAY, cpu_kernel=cpu_kernel)
    table = tf.Variable(np.ones([4, 2], np.float32), name="word_embeddings/weight")
    bias = tf.Variable(np.ones([2], np.float32), name="dense/bias")
    p, b = np.ones([4, 2]), np.ones([2])
    m, v, mb, vb = np.zeros([4, 2]), np.zeros([4, 2]), np.zeros(2), np.zeros(2)
    rng = np.random.default_rng(0)
    for t in range(1, 7):
        rows = (scale * rng.normal(size=[3, 2])).astype(np.float32)
        g_bias = (scale * rng.normal(size=[2])).astype(np.float32)
        dense_grad = np.zeros([4, 2])
        dense_grad[0] = rows[0]
        dense_grad[2] = rows[1] + rows[2]  # rows 1 and 2 both hit index 2
        sparse = tf.IndexedSlices(tf.constant(rows), tf.constant([0, 2, 2]), tf.constant([4, 2]))
        optimizer.apply_gradients([(sparse, table), (tf.constant(g_bias), bias)])
        lr = float(schedule(t - 1))  # step t runs at the schedule's value before it
        p, m, v = torch_adamw_step(p, dense_grad, m, v, t, lr, wd)
        b, mb, vb = torch_adamw_step(b, g_bias, mb, vb, t, lr, 0.0)  # biases do not decay
    np.testing.assert_allclose(table.numpy(), p, rtol=2e-6)
    np.testing.assert_allclose(bias.numpy(), b, rtol=2e-6)
    assert not np.allclose(p[0], 1.0, rtol=1e-3)  # the steps were big enough to be checked


def test_the_training_optimizer_uses_torchs_epsilon():
    cfg = RunConfig()
    optimizer = model.create_optimizer(cfg, model.make_plan(cfg, 100, 1), "float32")
    assert optimizer.epsilon == 1e-8


@pytest.mark.parametrize("setting, device, policy", [
    ("auto", "gpu", "mixed_float16"), ("auto", "tpu", "mixed_bfloat16"),
    ("none", "gpu", "float32"), ("mixed_bfloat16", "cpu", "mixed_bfloat16"),
])
def test_precision_policy(setting, device, policy):
    assert model.precision_policy(RunConfig(mixed_precision=setting), device) == policy


@pytest.mark.parametrize("flags, policy", [
    ("fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni", "mixed_bfloat16"),
    ("fpu avx2 amx_bf16 amx_tile", "mixed_bfloat16"),
    ("fpu sse2 avx2 avx512f avx512_vnni", "float32"),
])
def test_auto_precision_on_cpu_follows_native_bfloat16(tmp_path, monkeypatch, flags, policy):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n\n")
    assert model.cpu_has_native_bf16(str(cpuinfo)) == (policy == "mixed_bfloat16")
    monkeypatch.setattr(model, "cpu_has_native_bf16", lambda: policy == "mixed_bfloat16")
    assert model.precision_policy(RunConfig(), "cpu") == policy  # auto is the default


def test_no_cpuinfo_means_no_native_bfloat16(tmp_path):
    assert model.cpu_has_native_bf16(str(tmp_path / "absent")) is False


def test_empty_training_split_is_a_config_error():
    with pytest.raises(Exception, match="training split is empty"):
        model.make_plan(RunConfig(), 0, 1)


def test_start_of_training_line_explains_batch_learning_rate_and_steps():
    from tasks.steps import train

    cfg = RunConfig(per_replica_batch_size=16, grad_accum_steps=2, epochs=3, learning_rate=1e-4,
                    lr_scaling="sqrt", reference_batch_size=32, training_loop="custom")
    plan = model.make_plan(cfg, num_train_examples=1000, num_replicas=4)
    line = train.describe_plan(cfg, plan, "mirrored", "float32", cpu_kernels=True)
    assert line == ("train: strategy mirrored, 4 replicas x 16 per replica x 2 accumulation "
                    "= global batch 128; learning rate 0.0001 (sqrt: x sqrt(128/32)) = 0.0002; "
                    "8 steps per epoch, 24 steps in 3 epochs (2 warm-up); gradient clipping "
                    "1.0; precision float32; bertflow CPU kernels on")
    off = train.describe_plan(cfg.model_copy(update={"max_grad_norm": 0.0}), plan,
                              "mirrored", "float32")
    assert "; gradient clipping off; " in off
