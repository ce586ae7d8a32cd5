"""Raw strings in, entities out: the serving path of a token classification model, as the
pieces compose in an exported SavedModel (for the export step to wire).

    text -> whitespace_words (words, character spans)
         -> WordPieceAligner.encode_words (tasks/model/token_encoding.py: BertTextEncoder's
            pieces; the first piece of each word; with long_text window, the text's
            windows, each word in the one where it has the most context)
         -> model logits -> softmax -> word_predictions (first piece's tag and probability)
         -> decode_entities (grouped as pipeline("ner", aggregation_strategy="first"))

A signature's outputs must be dense tensors, so the entities of each text are padded to the
batch's largest count: `entity_group` and `word` with "", `start` and `end` with -1, `score`
with 0; `num_entities` [batch] says how many of each row are real.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import tensorflow as tf

from tasks.model import saved_resources
from tasks.training.entity_decoding import decode_entities, whitespace_words, word_predictions

if TYPE_CHECKING:  # annotations only: the export step passes one in
    from tasks.model.token_encoding import WordPieceAligner

_PADDING = {"entity_group": "", "word": "", "start": -1, "end": -1, "score": 0.0}


def entity_serving_module(aligner: WordPieceAligner, model, labels: list[str]) -> tf.Module:
    """A tf.Module whose `serve(text)` (tf.string [batch]) gives the padded entities; save it
    with tasks/steps/export.py's save_serving. `aligner`: the WordPieceAligner of
    the BertTextEncoder that wrote the training data; `model`: a token classification
    tasks.model Classifier whose outputs are `labels`."""
    module = tf.Module()
    # The tokenizer's tables, not its functions (tasks/model/saved_resources.py says why).
    module.tokenizer = saved_resources.resources(aligner)
    # The weights, not the Keras model, as the export step tracks them (tasks/steps/export.py).
    module.weights = list(model.variables)

    def serve(text):
        words, starts, ends = whitespace_words(text)
        pieces = aligner.encode_words(words)
        ids = pieces["input_ids"]
        logits = model({"input_ids": ids.to_tensor(),
                        "token_type_ids": pieces["token_type_ids"].to_tensor(),
                        "attention_mask": tf.ones_like(ids).to_tensor()}, training=False)
        # With long_text window the rows are windows; each word reads its own window's.
        tags, scores = word_predictions(tf.nn.softmax(logits, axis=-1), pieces["word_starts"],
                                        pieces.get("word_windows"))
        entities = decode_entities(text, starts, ends, tags, scores, labels)
        return {"num_entities": entities["start"].row_lengths(),
                **{name: values.to_tensor(default_value=_PADDING[name])
                   for name, values in entities.items()}}

    module.serve = tf.function(serve, input_signature=[tf.TensorSpec([None], tf.string,
                                                                      name="text")],
                               autograph=False)  # no branch on a tensor (export.py: why)
    return module
