"""tasks/training/float32_gelu.py: the feed-forward GELU in float32, on transformers' BERT layers."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from transformers.models.bert import modeling_tf_bert

from tasks.training import checkpoint, float32_gelu
from train_helpers import LABELS, logits_and_gradients, tiny_batch, tiny_model_dir  # noqa: F401

BATCH = tiny_batch()


@pytest.fixture
def policy():
    """Sets the global Keras policy for one test and restores float32 afterwards."""
    yield tf_keras.mixed_precision.set_global_policy
    tf_keras.mixed_precision.set_global_policy("float32")


def stock_and_ours(model_dir, weights=None):
    """transformers' model and ours, with equal weights."""
    ours = checkpoint.load_classifier(model_dir, LABELS)
    stock = checkpoint.load_classifier(model_dir, LABELS, float32_gelu=False)
    for model in (ours, stock):
        model(BATCH)
        model.set_weights(weights or ours.get_weights())
    return stock, ours


def intermediates(model):
    return [layer for layer in model.submodules
            if isinstance(layer, modeling_tf_bert.TFBertIntermediate)]


def test_every_feed_forward_layer_and_only_the_activation_changes(tiny_model_dir):  # noqa: F811
    stock, ours = stock_and_ours(tiny_model_dir)
    assert len(intermediates(ours)) == 2  # the tiny model's two layers
    assert all(layer.intermediate_act_fn is float32_gelu.gelu for layer in intermediates(ours))
    assert all(layer.intermediate_act_fn is not float32_gelu.gelu
               for layer in intermediates(stock))
    assert [v.name.split("/", 1)[1] for v in ours.weights] == \
        [v.name.split("/", 1)[1] for v in stock.weights]


def test_same_logits_and_gradients_in_float32(tiny_model_dir):  # noqa: F811
    results = [logits_and_gradients(model, BATCH) for model in stock_and_ours(tiny_model_dir)]
    (stock_logits, stock_grads), (our_logits, our_grads) = results
    np.testing.assert_allclose(our_logits, stock_logits, rtol=1e-6, atol=1e-7)
    for ours, theirs in zip(our_grads, stock_grads):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-7)


def test_mixed_bfloat16_stays_close_to_float32(tiny_model_dir, policy):  # noqa: F811
    reference = checkpoint.load_classifier(tiny_model_dir, LABELS)
    expected = reference(BATCH, training=False).logits.numpy()
    policy("mixed_bfloat16")
    stock, ours = stock_and_ours(tiny_model_dir, reference.get_weights())
    assert all(v.dtype == tf.float32 for v in ours.weights)
    errors = {}
    for name, model in (("stock", stock), ("ours", ours)):
        logits = model(BATCH, training=False).logits
        assert logits.dtype == tf.bfloat16
        errors[name] = np.abs(tf.cast(logits, tf.float32).numpy() - expected).max()
    # bfloat16 keeps 8 bits of mantissa; a float32 GELU is no further off than bfloat16's.
    assert errors["ours"] < 0.05 and errors["ours"] <= errors["stock"] + 0.01


def test_gelu_keeps_the_input_dtype():
    x = tf.constant([-3.0, -0.5, 0.0, 0.5, 3.0])
    expected = tf.nn.gelu(x, approximate=False).numpy()
    np.testing.assert_allclose(float32_gelu.gelu(x).numpy(), expected, rtol=1e-6)
    y = float32_gelu.gelu(tf.cast(x, tf.bfloat16))
    assert y.dtype == tf.bfloat16
    np.testing.assert_allclose(tf.cast(y, tf.float32).numpy(), expected, rtol=1e-2, atol=1e-2)
