"""tasks/model/cpu_kernels and the model's kernel layers (tasks/model/layers.py): bertflow's CPU
kernels against TensorFlow's own ops.

`make install` builds the library; these tests fail, not skip, when it is missing, because
training on CPU would then silently take the slow path. BERTFLOW_CPU_KERNELS=0 (switched off
on purpose) skips them.
"""
import os
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from tasks.model import cpu_kernels, layers
from tasks.training import checkpoint, model as model_lib
from train_helpers import LABELS, logits_and_gradients, tiny_batch, tiny_model_dir  # noqa: F401

if os.environ.get("BERTFLOW_CPU_KERNELS") == "0":
    pytest.skip("BERTFLOW_CPU_KERNELS=0 switches the CPU kernels off", allow_module_level=True)


@pytest.fixture(scope="module", autouse=True)
def library():
    if not cpu_kernels.available():
        pytest.fail(f"{cpu_kernels.library_path()} is not built: run `make install` "
                    "(or `python -m tasks.model.cpu_kernels build`; needs g++)")


def to_f32(t):
    return tf.cast(t, tf.float32).numpy()


def grad_of(fn, x, dy, extra=()):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return y, tape.gradient(y, [x, *extra], output_gradients=dy)


X = tf.constant(np.concatenate([np.linspace(-12, 12, 40001), [0.0, 1e-30, -1e-30]]), tf.float32)


def test_gelu_and_its_gradient_match_tensorflows_exact_gelu():
    dy = tf.random.stateless_normal(X.shape, [1, 2])
    y, (dx,) = grad_of(cpu_kernels.gelu, X, dy)
    y_ref, (dx_ref,) = grad_of(lambda x: tf.nn.gelu(x, approximate=False), X, dy)
    np.testing.assert_allclose(y.numpy(), y_ref.numpy(), rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(dx.numpy(), dx_ref.numpy(), rtol=1e-5, atol=2e-6)


def test_gelu_keeps_nan_and_dropout_zeroes_what_it_drops_even_nan():
    """The kernels clamp and mask with integer operations on the float bits (so that they
    vectorize): NaN must still come out of GELU and its gradient, and a dropped NaN is 0."""
    x = tf.constant([np.nan, -np.nan, 1.0], tf.float32)
    y, (dx,) = grad_of(cpu_kernels.gelu, x, tf.ones_like(x))
    assert np.isnan(y.numpy()[:2]).all() and np.isnan(dx.numpy()[:2]).all()
    assert np.isfinite(y.numpy()[2]) and np.isfinite(dx.numpy()[2])
    y = cpu_kernels.dropout(tf.fill([4096], np.float32(np.nan)), 0.5).numpy()
    dropped = ~np.isnan(y)
    assert 0.4 < dropped.mean() < 0.6 and (y[dropped] == 0).all()


def test_every_loops_avx2_clone_is_vectorized():
    """Each hot loop is compiled for AVX-512, AVX2 and baseline x86-64 (target_clones). A
    branch in a loop body (a float clamp, a select) keeps GCC from vectorizing it without
    AVX-512's masks, and the AVX2 clone then runs one element at a time: GELU took 3x as long
    on an AVX2-only CPU. So every AVX2 clone must use 256-bit (ymm) registers."""
    import re
    import shutil
    import subprocess

    objdump = shutil.which("objdump")
    assert objdump, "objdump (binutils, installed with g++) is needed to read the library"
    listing = subprocess.run([objdump, "-d", "--no-show-raw-insn", "-C",
                              str(cpu_kernels.library_path())],
                             capture_output=True, text=True, check=True).stdout
    ymm: dict[str, int] = {}
    name = None
    for line in listing.splitlines():
        header = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if header:
            name = header.group(1) if header.group(1).endswith("[clone .avx2]") else None
            if name:
                ymm[name] = 0
        elif name and "%ymm" in line:
            ymm[name] += 1
    loops = {re.sub(r"^(void )?\(anonymous namespace\)::", "", n).split("(")[0] for n in ymm}
    assert {"gelu<float>", "gelu_grad<float>", "masked_scale<float>", "draw", "sweep",
            "forward_row<float>", "backward_row<float>"} <= loops, loops
    scalar = sorted(n for n, count in ymm.items() if count == 0)
    assert not scalar, f"AVX2 clones without vector instructions: {scalar}"


def test_bfloat16_gelu_is_the_float32_result_rounded():
    xb = tf.cast(X, tf.bfloat16)
    y = cpu_kernels.gelu(xb)
    assert y.dtype == tf.bfloat16
    exact = tf.nn.gelu(tf.cast(xb, tf.float32), approximate=False)
    # At most one bfloat16 step (2^-8 relative) from the exactly rounded value.
    np.testing.assert_allclose(to_f32(y), exact.numpy(), rtol=2 ** -8, atol=2e-6)


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_layer_norm_matches_keras_values_and_gradients(dtype):
    x = tf.cast(tf.random.stateless_normal([3, 5, 48], [3, 4]) * 3 + 1, dtype)
    dy = tf.cast(tf.random.stateless_normal(x.shape, [5, 6]), dtype)
    ref = tf_keras.layers.LayerNormalization(epsilon=1e-12)
    ref.build(x.shape)
    ref.gamma.assign(tf.random.stateless_normal([48], [7, 8]))
    ref.beta.assign(tf.random.stateless_normal([48], [9, 10]))
    results = []
    for fn in (lambda t: tf.cast(ref(t), dtype),
               lambda t: cpu_kernels.layer_norm(t, ref.gamma, ref.beta, 1e-12)):
        y, grads = grad_of(fn, x, dy, extra=(ref.gamma, ref.beta))
        assert y.dtype == dtype
        results.append([to_f32(y)] + [to_f32(g) for g in grads])
    tol = {tf.float32: 1e-5, tf.bfloat16: 2 ** -7}[dtype]
    for ours, theirs, name in zip(results[1], results[0], ["y", "dx", "dgamma", "dbeta"]):
        np.testing.assert_allclose(ours, theirs, rtol=tol, atol=tol, err_msg=name)


# Run in a fresh process with N intra-op threads (set before TensorFlow runs an op): prints
# the sha256 of LayerNormGrad's dgamma and dbeta on LN_GRAD_INPUT's rows.
LN_GRAD_SCRIPT = """
import hashlib, sys
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
sys.path.insert(0, "tests")
from test_cpu_kernels import layer_norm_grad_sums
print(hashlib.sha256(layer_norm_grad_sums()).hexdigest())
"""


def layer_norm_grad_sums(rows: int = 4095, width: int = 384) -> bytes:
    """dgamma and dbeta of BertflowLayerNormGrad on seeded rows, as bytes."""
    x = tf.random.stateless_normal([rows, width], [1, 2])
    dy = tf.random.stateless_normal([rows, width], [3, 4])
    gamma = tf.random.stateless_normal([width], [5, 6])
    _, mean, rstd = cpu_kernels.ops().bertflow_layer_norm(x, gamma, tf.zeros([width]),
                                                         epsilon=1e-12)
    _, dgamma, dbeta = cpu_kernels.ops().bertflow_layer_norm_grad(dy, x, gamma, mean, rstd)
    return dgamma.numpy().tobytes() + dbeta.numpy().tobytes()


def test_layer_norm_gradient_is_the_same_bits_every_call_and_for_any_thread_count():
    """dgamma and dbeta sum over every row. The kernel once added each thread's share as the
    threads finished: 200 calls on these rows gave 9 different results, and two training
    runs with one seed ended with different weights (issue 34). Per-block sums added in block
    order give one result, whatever the number of intra-op threads."""
    import hashlib
    import subprocess
    import sys
    from pathlib import Path

    results = {layer_norm_grad_sums() for _ in range(100)}
    assert len(results) == 1
    here = hashlib.sha256(results.pop()).hexdigest()
    root = Path(__file__).resolve().parent.parent
    for threads in (1, 3):
        done = subprocess.run([sys.executable, "-c", LN_GRAD_SCRIPT, str(threads)], cwd=root,
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "TF_USE_LEGACY_KERAS": "1"})
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split()[-1] == here, threads


def test_dropout_keeps_the_right_share_scaled_and_routes_the_gradient_through_it():
    x = tf.random.stateless_uniform([1000, 1000], [1, 1], minval=1.0, maxval=2.0)
    y, (dx,) = grad_of(lambda t: cpu_kernels.dropout(t, 0.1), x, tf.ones_like(x))
    y, dx, x = y.numpy(), dx.numpy(), x.numpy()
    kept = y != 0
    assert abs(kept.mean() - 0.9) < 0.002  # 1e6 draws: the standard error is 0.0003
    np.testing.assert_allclose(y[kept], x[kept] / 0.9, rtol=1e-6)
    np.testing.assert_allclose(dx, kept / 0.9, rtol=1e-6)  # d(sum y)/dx
    # Kept elements are spread evenly: every row and column keeps close to 90%.
    assert kept.mean(axis=0).min() > 0.85 and kept.mean(axis=1).min() > 0.85


def test_dropout_draws_a_new_mask_each_call_and_repeats_under_a_global_seed():
    x = tf.ones([64, 64], tf.bfloat16)
    masks = []
    for _ in range(2):
        tf_keras.utils.set_random_seed(7)
        masks.append([cpu_kernels.dropout(x, 0.5).numpy() != 0 for _ in range(2)])
    (a1, a2), (b1, b2) = masks
    assert (a1 != a2).any()
    assert (a1 == b1).all() and (a2 == b2).all()


def test_dropout_rejects_a_rate_outside_zero_to_one():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"dropout rate must be in \[0, 1\)"):
        cpu_kernels.dropout(tf.ones([4]), 1.0)


def adamw_steps(kernel: bool, sparse: bool, clip: float | None) -> tuple[np.ndarray, ...]:
    """A table and a bias after 3 AdamW steps on random gradients (the table's sparse, with
    repeated rows, if `sparse`), decay on for the table and off for the bias."""
    opt = model_lib.AdamW(cpu_kernel=kernel, learning_rate=0.05, weight_decay=0.1, epsilon=1e-8,
                          exclude_from_weight_decay=model_lib.NO_DECAY, global_clipnorm=clip)
    init = np.random.default_rng(0).normal(size=[6, 4]).astype(np.float32)
    table = tf.Variable(init, name="word_embeddings/weight")
    bias = tf.Variable(init[0], name="dense/bias")
    for t in range(3):
        rows = tf.random.stateless_normal([5, 4], [t, 0])
        g = (tf.IndexedSlices(rows, tf.constant([1, 4, 1, 0, 5]), tf.constant([6, 4]))
             if sparse else tf.random.stateless_normal([6, 4], [t, 1]))
        opt.apply_gradients([(g, table), (rows[0], bias)])
    assert not np.allclose(table.numpy(), init)
    return table.numpy(), bias.numpy()


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("clip", [None, 100.0, 1.5])
def test_adamw_kernel_takes_the_same_steps_as_tensorflows_kernels(sparse, clip):
    """The whole AdamW rule itself is checked in test_train_plan; here the one-pass kernel
    follows the two-kernel path step for step, decay on and off, sparse rows repeated, and
    with global-norm clipping that never acts (100) or acts every step (1.5: the gradients'
    norm is 5-7), which the kernel applies itself and Keras by tf.clip_by_global_norm."""
    ours = adamw_steps(True, sparse, clip)
    for got, want in zip(ours, adamw_steps(False, sparse, clip)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    if clip == 1.5:  # the clipping changed the steps
        assert not np.allclose(ours[0], adamw_steps(True, sparse, None)[0], rtol=1e-4)


MIRRORED_CLIPPED_STEPS = """
import numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from tasks.training import model as model_lib

def run(kernel):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        w = tf.Variable(np.random.default_rng(0).normal(size=[6, 4]).astype(np.float32),
                        name="dense/kernel")
        opt = model_lib.AdamW(cpu_kernel=kernel, learning_rate=0.05, weight_decay=0.1,
                              epsilon=1e-8, global_clipnorm=1.5)
        model_lib.create_slots(opt, [w])

    @tf.function
    def step(t):
        def replica_step():
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            opt.apply_gradients([(tf.random.stateless_normal([6, 4], [t, replica]) * 3, w)])
        strategy.run(replica_step)
    for t in range(3):
        step(tf.constant(t))
    return w.numpy()

print(np.abs(run(True) - run(False)).max())
"""


def test_adamw_kernel_clips_like_keras_under_mirrored_strategy():
    """Under MirroredStrategy each replica computes the clipping factor from the summed
    gradients and one merge builds every replica's update: the kernel's steps on 2 replicas
    (2 logical CPUs, so a fresh process) follow Keras' clip_by_global_norm path."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", MIRRORED_CLIPPED_STEPS], capture_output=True,
                         text=True, timeout=300, cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0, out.stderr[-3000:]
    assert float(out.stdout.split()[-1]) < 1e-6, out.stdout


def test_adamw_kernel_leaves_a_value_read_before_the_step_alone():
    """A tensor read from the variable before the update still holds the old value: the kernel
    copies a buffer that a reader shares instead of writing through it."""
    var = tf.Variable(np.ones([8], np.float32), name="w")
    opt = model_lib.AdamW(learning_rate=0.1, weight_decay=0.0, cpu_kernel=True)
    before = var.read_value()
    opt.apply_gradients([(tf.ones([8]), var)])
    assert (before.numpy() == 1.0).all() and (var.numpy() < 1.0).all()


def test_kernel_layers_give_the_stock_outputs_and_gradients(tiny_model_dir):  # noqa: F811
    batch = tiny_batch()
    stock = checkpoint.load_classifier(tiny_model_dir, LABELS, gelu="native")
    ours = checkpoint.load_classifier(tiny_model_dir, LABELS, cpu_kernels=True)
    kernel_layers = [layer for layer in ours.submodules
                     if isinstance(layer, (layers.Dropout, layers.LayerNorm))]
    assert kernel_layers and all(layer.use_cpu_kernel for layer in kernel_layers)
    assert [v.name for v in ours.weights] == [v.name for v in stock.weights]
    results = [logits_and_gradients(model, batch) for model in (stock, ours)]
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-5, atol=1e-6)
    for ours_g, stock_g in zip(results[1][1], results[0][1]):
        np.testing.assert_allclose(ours_g, stock_g, rtol=1e-4, atol=1e-6)
    # Training mode draws dropout masks: two calls differ, inference is deterministic.
    train1, train2 = (ours(batch, training=True).numpy() for _ in range(2))
    assert not np.allclose(train1, train2)
    np.testing.assert_array_equal(ours(batch).numpy(), ours(batch).numpy())


def test_float16_layers_fall_back_to_the_stock_implementation():
    x = tf.random.stateless_normal([2, 3, 8], [1, 2])
    ln = layers.LayerNorm(epsilon=1e-3, use_cpu_kernel=True, dtype="float16")
    ref = tf_keras.layers.LayerNormalization(dtype="float16")
    np.testing.assert_array_equal(ln(tf.cast(x, tf.float16)).numpy(),
                                  ref(tf.cast(x, tf.float16)).numpy())
    y = layers.kernel_gelu(tf.cast(x, tf.float16))
    assert y.dtype == tf.float16


def test_a_stale_or_missing_build_is_not_loaded(monkeypatch, tmp_path):
    """The library's file name hashes its sources: another build directory, or edited
    sources, mean "not built" (and the slow path), never a mismatched library."""
    monkeypatch.setattr(cpu_kernels, "BUILD_DIR", tmp_path)
    assert not cpu_kernels.library_path().exists()
    cpu_kernels.library.cache_clear()
    try:
        assert cpu_kernels.library() is None and not cpu_kernels.available()
    finally:
        monkeypatch.undo()
        cpu_kernels.library.cache_clear()
    assert cpu_kernels.available()
