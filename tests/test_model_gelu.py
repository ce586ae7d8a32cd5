"""The feed-forward GELU choices of bertflow's model (tasks/model/layers.py): computed in
float32 under mixed precision (the default without the CPU kernels) or in the compute dtype."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from tasks.model import layers
from tasks.training import checkpoint
from train_helpers import LABELS, logits_and_gradients, tiny_batch, tiny_model_dir  # noqa: F401

BATCH = tiny_batch()


@pytest.fixture
def policy():
    """Sets the global Keras policy for one test and restores float32 afterwards."""
    yield tf_keras.mixed_precision.set_global_policy
    tf_keras.mixed_precision.set_global_policy("float32")


def native_and_float32(model_dir):
    """The same checkpoint with the GELU in the compute dtype and in float32."""
    return (checkpoint.load_classifier(model_dir, LABELS, gelu="native"),
            checkpoint.load_classifier(model_dir, LABELS, gelu="float32"))


def test_same_logits_and_gradients_in_float32(tiny_model_dir):  # noqa: F811
    results = [logits_and_gradients(model, BATCH) for model in native_and_float32(tiny_model_dir)]
    (native_logits, native_grads), (our_logits, our_grads) = results
    np.testing.assert_allclose(our_logits, native_logits, rtol=1e-6, atol=1e-7)
    for ours, theirs in zip(our_grads, native_grads):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-7)


def test_mixed_bfloat16_stays_close_to_float32(tiny_model_dir, policy):  # noqa: F811
    expected = checkpoint.load_classifier(tiny_model_dir, LABELS)(BATCH, training=False).numpy()
    policy("mixed_bfloat16")
    native, ours = native_and_float32(tiny_model_dir)
    assert all(v.dtype == tf.float32 for v in ours.weights)
    errors = {}
    for name, model in (("native", native), ("ours", ours)):
        logits = model(BATCH, training=False)
        assert logits.dtype == tf.float32  # the model casts its logits back
        errors[name] = np.abs(logits.numpy() - expected).max()
    # bfloat16 keeps 8 bits of mantissa; a float32 GELU is no further off than bfloat16's.
    assert errors["ours"] < 0.05 and errors["ours"] <= errors["native"] + 0.01


def test_gelu_keeps_the_input_dtype():
    x = tf.constant([-3.0, -0.5, 0.0, 0.5, 3.0])
    expected = tf.nn.gelu(x, approximate=False).numpy()
    np.testing.assert_allclose(layers.float32_gelu(x).numpy(), expected, rtol=1e-6)
    y = layers.float32_gelu(tf.cast(x, tf.bfloat16))
    assert y.dtype == tf.bfloat16
    np.testing.assert_allclose(tf.cast(y, tf.float32).numpy(), expected, rtol=1e-2, atol=1e-2)
