"""tasks/training/entity_serving.py: a tiny random BERT token model behind the serving module,
saved and loaded as a SavedModel signature, gives the entities that a reference built outside
TensorFlow's graph gives: the model's logits at each word's first piece, argmax and max of
their softmax in numpy, grouped by transformers' own group_entities (tests/
test_entity_decoding.py's pipeline_groups). Rows: names and places, an empty text, one cut
by max_seq_length, non-ASCII words with punctuation."""
from __future__ import annotations

import re

import numpy as np
import tensorflow as tf

from tasks.model.classifier import build_classifier
from tasks.model.config import EncoderConfig
from tasks.model.heads import TOKEN_CLASSIFICATION
from tasks.model.text_encoder import BertTextEncoder
from tasks.training.checkpoint_sources import default_base_model_dir
from tasks.steps.export import save_serving
from tasks.training.entity_serving import entity_serving_module
from tasks.model.token_encoding import WordPieceAligner
from test_entity_decoding import LABELS, pipeline_groups

TEXTS = ["Ada Lovelace lived in London with Charles Babbage", "", "x " * 20,
         "Zürich, Genève  and\tNew York!"]
MAX_SEQ_LENGTH = 16


def tiny_token_model():
    config = EncoderConfig.from_dict(dict(
        model_type="bert", vocab_size=30522, hidden_size=32, num_hidden_layers=1,
        num_attention_heads=4, intermediate_size=37, max_position_embeddings=64))
    model = build_classifier(config, len(LABELS), task=TOKEN_CLASSIFICATION)
    # Spread the logits so that the random model predicts every tag somewhere.
    kernel = model.head.classifier.kernel
    kernel.assign(np.random.default_rng(0).normal(0, 1, kernel.shape).astype(np.float32))
    return model


def reference(encoder, model, text):
    spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    aligner = WordPieceAligner(encoder)
    pieces = aligner.encode_words(tf.ragged.constant([text.split()], dtype=tf.string,
                                                     row_splits_dtype=tf.int64))
    ids = pieces["input_ids"].to_tensor()
    logits = model({"input_ids": ids, "token_type_ids": tf.zeros_like(ids),
                    "attention_mask": tf.ones_like(ids)}, training=False).numpy()[0]
    probabilities = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    starts = pieces["word_starts"].to_list()[0]
    # Words cut off by max_seq_length come last and belong to no entity: left out.
    kept = [i for i, start in enumerate(starts) if start >= 0]
    at = probabilities[[starts[i] for i in kept]]
    return pipeline_groups([text.split()[i] for i in kept], [spans[i] for i in kept],
                           at.argmax(-1).tolist(), at.max(-1).tolist())


def test_saved_signature_gives_the_reference_entities(tmp_path):
    encoder = BertTextEncoder(default_base_model_dir() / "vocab.txt", True, MAX_SEQ_LENGTH)
    model = tiny_token_model()
    aligner = WordPieceAligner(encoder)
    module = entity_serving_module(aligner, model, LABELS)
    save_serving(module, tmp_path)  # as the export step saves it
    # The save traced none of the tokenizer's functions that serving does not call
    # (tasks/model/saved_resources.py): their traces were most of a token export's save.
    assert [f.experimental_get_tracing_count() for f in (
        aligner.align, aligner.align_max_context, encoder.encode, encoder.encode_pair)] == [
            0, 0, 0, 0]
    serve = tf.saved_model.load(str(tmp_path)).signatures["serving_default"]
    out = {k: v.numpy() for k, v in serve(text=tf.constant(TEXTS)).items()}
    total = 0
    for row, text in enumerate(TEXTS):
        n = int(out["num_entities"][row])
        got = [(out["entity_group"][row, i].decode(), int(out["start"][row, i]),
                int(out["end"][row, i])) for i in range(n)]
        expected = reference(encoder, model, text)
        assert got == [(kind, start, end) for kind, start, end, _ in expected]
        np.testing.assert_allclose(out["score"][row, :n], [s for *_, s in expected], atol=1e-4)
        assert [w.decode() for w in out["word"][row, :n]] == [text[s:e] for _, s, e in got]
        assert (out["start"][row, n:] == -1).all() and (out["entity_group"][row, n:] == b"").all()
        total += n
    assert total >= 3  # the random model does find entities
