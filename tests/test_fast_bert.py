"""tasks/fast_bert.py computes what transformers' BERT layers compute, on the same weights."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from tasks import checkpoint, fast_bert
from train_helpers import LABELS, tiny_model_dir  # noqa: F401


@pytest.fixture
def policy():
    """Sets the global Keras policy for one test and restores float32 afterwards."""
    yield tf_keras.mixed_precision.set_global_policy
    tf_keras.mixed_precision.set_global_policy("float32")


def stock_and_fast(model_dir):
    """The stock transformers model and the sped-up one, with equal weights."""
    fast = checkpoint.load_classifier(model_dir, LABELS)
    stock = checkpoint.load_classifier(model_dir, LABELS)
    for layer in stock.submodules:  # undo speed_up: back to transformers' own classes
        if type(layer).__module__ == fast_bert.__name__:
            layer.__class__ = type(layer).__mro__[1]
        if getattr(layer, "intermediate_act_fn", None) is fast_bert.gelu_in_float32:
            from transformers.models.bert import modeling_tf_bert
            layer.intermediate_act_fn = modeling_tf_bert.get_tf_activation("gelu")
    batch = {"input_ids": tf.constant([[2, 5, 6, 7, 3], [2, 8, 3, 0, 0]]),
             "token_type_ids": tf.constant([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]]),
             "attention_mask": tf.constant([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])}
    fast(batch)
    stock(batch)
    stock.set_weights(fast.get_weights())
    return stock, fast, batch


def test_speed_up_swaps_layers_and_keeps_every_variable_name(tiny_model_dir):  # noqa: F811
    stock, fast, _ = stock_and_fast(tiny_model_dir)
    kinds = {type(layer).__name__ for layer in fast.submodules}
    assert {"_Embeddings", "_Dropout"} <= kinds and "Dropout" not in kinds
    assert [v.name.split("/", 1)[1] for v in fast.weights] == \
        [v.name.split("/", 1)[1] for v in stock.weights]


def test_same_logits_and_gradients_in_float32(tiny_model_dir):  # noqa: F811
    stock, fast, batch = stock_and_fast(tiny_model_dir)
    labels = tf.constant([0, 1])
    results = []
    for model in (stock, fast):
        with tf.GradientTape() as tape:
            logits = model(batch, training=False).logits
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
        grads = tape.gradient(loss, model.trainable_variables)
        results.append((logits.numpy(), [tf.convert_to_tensor(g).numpy() for g in grads]))
    (stock_logits, stock_grads), (fast_logits, fast_grads) = results
    np.testing.assert_allclose(fast_logits, stock_logits, rtol=1e-5, atol=1e-6)
    assert len(fast_grads) == len(stock_grads)
    for ours, theirs in zip(fast_grads, stock_grads):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-6)


def test_mixed_bfloat16_logits_stay_close_to_float32(tiny_model_dir, policy):  # noqa: F811
    _, reference, batch = stock_and_fast(tiny_model_dir)
    expected = reference(batch, training=False).logits.numpy()
    policy("mixed_bfloat16")
    stock, fast, _ = stock_and_fast(tiny_model_dir)
    for model in (stock, fast):
        model.set_weights(reference.get_weights())
    ours = tf.cast(fast(batch, training=False).logits, tf.float32).numpy()
    theirs = tf.cast(stock(batch, training=False).logits, tf.float32).numpy()
    # bfloat16 keeps 8 bits of mantissa: both are within its rounding of float32, and ours
    # (float32 GELU, rows cast after the gather) is no further off than transformers'.
    assert np.abs(ours - expected).max() < 0.05
    assert np.abs(ours - expected).max() <= np.abs(theirs - expected).max() + 0.01


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_dropout_drops_at_the_rate_and_keeps_the_mean(rate):
    tf.random.set_seed(1)
    x = tf.ones([1000, 1001])  # odd size: the last 32-bit draw is only half used
    y = fast_bert.dropout_16bit(x, rate).numpy()
    values = np.unique(y)
    assert len(values) == 2 and values[0] == 0 and values[1] == pytest.approx(1 / (1 - rate))
    dropped = np.mean(y == 0)
    assert abs(dropped - rate) < 0.003  # 1M draws: 5 standard deviations at most
    assert abs(y.mean() - 1.0) < 0.005
    columns, rows = np.mean(y == 0, axis=0), np.mean(y == 0, axis=1)
    assert columns.std() < 0.05 and rows.std() < 0.05  # no position drops more than others


def test_dropout_layer_is_identity_unless_training(tiny_model_dir):  # noqa: F811
    fast = checkpoint.load_classifier(tiny_model_dir, LABELS)
    layer = next(lay for lay in fast.submodules if type(lay).__name__ == "_Dropout")
    x = tf.ones([4, 64])
    np.testing.assert_array_equal(layer(x, training=False).numpy(), x.numpy())
    assert np.mean(layer(x, training=True).numpy() == 0) > 0
