"""DeBERTa-v2/v3's encoder (tasks/model/deberta.py) on its own; tests/test_model_parity.py
compares it with transformers' PyTorch DebertaV2 classes.

- config.json: options it does not build (p2p, the convolution, DeBERTa v1, ...) are refused
  naming the field; runs accept deberta-v2 (its tokenizer: tests/test_deberta_steps.py).
- The model: a row's logits do not depend on how much padding follows it; a graph traced for
  any batch shape gives the eager logits; every weight gets a gradient; bertflow's CPU
  kernels agree with TensorFlow's ops; mixed bfloat16 keeps float32 weights and logits;
  seeded dropout numbers the DeBERTa dropout layers; with a static length the graph holds
  no float64 op (the log buckets are a constant: TPUs have no float64).
- A pretrained encoder's checkpoint (MaskedLM keys, v3's unused position table) loads with
  only the pooler and classifier fresh, as transformers starts them.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from tasks.errors import ConfigError
from tasks.model import cpu_kernels
from tasks.model.classifier import build_classifier
from tasks.model.config import FAMILIES, EncoderConfig
from tasks.model.hf_weights import load_hf_weights, save_hf_checkpoint
from tasks.model.layers import Dropout
from tasks.training import seeded_dropout

# DeBERTa-v3's settings (as microsoft/deberta-v3-base's config.json has them), tiny.
V3 = dict(model_type="deberta-v2", vocab_size=99, hidden_size=32, num_hidden_layers=2,
          num_attention_heads=4, intermediate_size=37, max_position_embeddings=64,
          relative_attention=True, position_buckets=8, max_relative_positions=-1,
          pos_att_type="p2c|c2p", share_att_key=True, norm_rel_ebd="layer_norm",
          position_biased_input=False, type_vocab_size=0, hidden_act="gelu",
          layer_norm_eps=1e-7)
LABELS = 3


def v3(**overrides) -> EncoderConfig:
    return EncoderConfig.from_dict({**V3, **overrides})


def batch(pad: int = 0) -> dict[str, tf.Tensor]:
    """Two rows of 12 tokens (the second with 4 padding positions), then `pad` more padding
    positions on both."""
    ids = np.array([[2, *range(5, 15), 3], [2, *range(20, 26), 3, 0, 0, 0, 0]])
    mask = (np.arange(12) < np.array([[12], [8]])).astype(np.int32)
    ids, mask = (np.pad(a, [(0, 0), (0, pad)]) for a in (ids, mask))
    return {"input_ids": tf.constant(ids, tf.int32), "attention_mask": tf.constant(mask),
            "token_type_ids": tf.zeros_like(tf.constant(ids, tf.int32))}


@pytest.fixture(autouse=True)
def float32_policy():
    tf_keras.mixed_precision.set_global_policy("float32")
    yield
    tf_keras.mixed_precision.set_global_policy("float32")


def test_v3_settings_are_read():
    options = v3().deberta
    assert options.pos_att_type == ("p2c", "c2p") and options.scale_factor == 3
    assert options.max_relative_positions == 64  # -1: max_position_embeddings
    assert options.attention_span == 8 and options.share_att_key
    assert options.norm_rel_embeddings and not options.position_biased_input
    assert v3(pos_att_type=["c2p"], cls_dropout=0.3).classifier_dropout == 0.3
    assert v3().classifier_dropout == 0.1  # hidden_dropout_prob when cls_dropout is unset


@pytest.mark.parametrize("overrides,field", [
    (dict(pos_att_type="p2c|c2p|p2p"), "pos_att_type"),
    (dict(conv_kernel_size=3), "conv_kernel_size"),
    (dict(embedding_size=16), "embedding_size"),
    (dict(pooler_hidden_size=16), "pooler_hidden_size"),
    (dict(attention_head_size=4), "attention_head_size"),
    (dict(norm_rel_ebd="layer_norm|bias"), "norm_rel_ebd"),
    (dict(pooler_hidden_act="swish"), "pooler_hidden_act"),
])
def test_options_not_built_are_refused_naming_the_field(overrides, field):
    with pytest.raises(ConfigError) as refused:
        v3(**overrides)
    assert refused.value.field == "base_model" and field in str(refused.value)


def test_deberta_v1_is_refused():
    with pytest.raises(ConfigError, match="model_type 'deberta'; supported"):
        EncoderConfig.from_dict({**V3, "model_type": "deberta"})


def test_runs_accept_deberta_v3():
    assert "deberta-v2" in FAMILIES
    assert EncoderConfig.from_dict(V3).family == "deberta-v2"


def test_a_rows_logits_do_not_depend_on_the_padding_after_it():
    model = build_classifier(v3(), LABELS)
    short, padded = (model(batch(pad), training=False).numpy() for pad in (0, 9))
    np.testing.assert_allclose(padded, short, atol=1e-5)
    # and the same row alone, without padding
    alone = {k: v[1:, :8] for k, v in batch().items()}
    np.testing.assert_allclose(model(alone, training=False).numpy(), short[1:], atol=1e-5)


def test_a_graph_for_any_shape_gives_the_eager_logits_and_every_weight_a_gradient():
    model = build_classifier(v3(share_att_key=False, position_biased_input=True,
                                type_vocab_size=2), LABELS)
    spec = {name: tf.TensorSpec([None, None], tf.int32) for name in batch()}

    @tf.function(input_signature=[spec])
    def step(features):
        with tf.GradientTape() as tape:
            logits = model(features, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                tf.constant([0, 2]), logits))
        return model(features, training=False), tape.gradient(loss,
                                                              model.trainable_variables)

    for pad in (0, 5):
        logits, grads = step(batch(pad))
        np.testing.assert_allclose(logits.numpy(), model(batch(pad)).numpy(), atol=1e-6)
    missing = [v.name for v, g in zip(model.trainable_variables, grads) if g is None]
    assert not missing


def test_cpu_kernels_agree_with_tensorflow_ops():
    if not cpu_kernels.available():
        pytest.skip(f"bertflow CPU kernels not built ({cpu_kernels.library_path().name}; "
                    "`python -m tasks.model.cpu_kernels build`)")
    stock = build_classifier(v3(), LABELS)
    kernels = build_classifier(v3(), LABELS, cpu_kernels=True)
    kernels.set_weights(stock.get_weights())
    np.testing.assert_allclose(kernels(batch()).numpy(), stock(batch()).numpy(),
                               rtol=1e-5, atol=1e-6)


def test_mixed_bfloat16_keeps_float32_weights_and_logits():
    reference = build_classifier(v3(), LABELS)
    tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = build_classifier(v3(), LABELS)
    model.set_weights(reference.get_weights())
    sequence, _ = model.encoder(batch())
    logits = model(batch(), training=False)
    assert sequence.dtype == tf.bfloat16 and logits.dtype == tf.float32
    assert {v.dtype for v in model.variables} == {tf.float32}
    np.testing.assert_allclose(logits.numpy(), reference(batch()).numpy(), atol=0.02)


def test_seeded_dropout_covers_every_deberta_dropout():
    model = build_classifier(v3(hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2,
                                pooler_dropout=0.2), LABELS)
    # embeddings; per block: probs, relative embeddings, attention output, feed-forward;
    # the head's pooler and classifier dropouts.
    count = model.seed_dropout(seeded_dropout.DropoutSeeds(7, tf.Variable(0, tf.int64)))
    assert count == 1 + 2 * 4 + 2
    indices = sorted(layer.index for layer in model._flatten_layers()
                     if isinstance(layer, Dropout))
    assert indices == list(range(count))
    first, again = (model(batch(), training=True).numpy() for _ in range(2))
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, model(batch(), training=False).numpy())


def test_a_static_length_puts_no_float64_op_in_the_graph():
    model = build_classifier(v3(), LABELS)
    spec = {name: tf.TensorSpec([2, 12], tf.int32) for name in batch()}
    graph = tf.function(lambda features: model(features, training=False)).get_concrete_function(
        spec).graph
    dtypes = {output.dtype for op in graph.get_operations() for output in op.outputs}
    assert tf.float64 not in dtypes and tf.float32 in dtypes


def test_a_pretrained_encoder_loads_with_a_fresh_pooler_and_classifier(tmp_path):
    from safetensors.numpy import load_file, save_file

    model = build_classifier(v3(), LABELS)
    save_hf_checkpoint(model, ["a", "b", "c"], tmp_path)
    state = {k: v for k, v in load_file(str(tmp_path / "model.safetensors")).items()
             if k.startswith("deberta.")}
    # What DebertaV2ForMaskedLM saves beside the encoder, and a position table v3 ignores.
    state["lm_predictions.lm_head.bias"] = np.zeros(99, np.float32)
    state["deberta.embeddings.position_embeddings.weight"] = np.zeros((64, 32), np.float32)
    save_file(state, str(tmp_path / "model.safetensors"))
    loaded = build_classifier(v3(), LABELS)
    fresh = load_hf_weights(loaded, tmp_path, keep_head=True)
    assert sorted(fresh) == ["classifier.bias", "classifier.weight", "pooler.dense.bias",
                             "pooler.dense.weight"]
    sequence, _ = loaded.encoder(batch())
    np.testing.assert_array_equal(sequence.numpy(), model.encoder(batch())[0].numpy())
