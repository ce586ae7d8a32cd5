"""Task heads on top of the encoder, each as transformers' PyTorch class of its family has it.

HEADS maps a task and a family to its head class. A head is called with the encoder's
(sequence output, pooled output or None) and returns logits in the compute dtype: [batch,
num_labels] for sequence classification, [batch, seq, num_labels] for token classification.
"""
from __future__ import annotations

import tf_keras

from tasks.model.config import EncoderConfig
from tasks.model.layers import LayerFactory

SEQUENCE_CLASSIFICATION = "sequence_classification"
TOKEN_CLASSIFICATION = "token_classification"


class BertSequenceHead(tf_keras.layers.Layer):
    """BertForSequenceClassification: pooled output -> dropout -> classifier."""

    def __init__(self, config: EncoderConfig, num_labels: int, make: LayerFactory, **kwargs):
        super().__init__(**kwargs)
        self.dropout = make.dropout(config.classifier_dropout)
        self.classifier = make.dense(num_labels, "classifier")

    def call(self, sequence, pooled, training=None):
        return self.classifier(self.dropout(pooled, training=training))


class DistilBertSequenceHead(tf_keras.layers.Layer):
    """DistilBertForSequenceClassification: first token -> pre_classifier -> ReLU -> dropout
    (seq_classif_dropout) -> classifier."""

    def __init__(self, config: EncoderConfig, num_labels: int, make: LayerFactory, **kwargs):
        super().__init__(**kwargs)
        self.pre_classifier = make.dense(config.hidden_size, "pre_classifier", activation="relu")
        self.dropout = make.dropout(config.classifier_dropout)
        self.classifier = make.dense(num_labels, "classifier")

    def call(self, sequence, pooled, training=None):
        hidden = self.dropout(self.pre_classifier(sequence[:, 0]), training=training)
        return self.classifier(hidden)


class ElectraSequenceHead(tf_keras.layers.Layer):
    """ElectraForSequenceClassification: first token -> dropout -> dense -> GELU -> dropout ->
    out_proj. PyTorch applies one Dropout module twice; here they are two layers, so that
    seeded masks of the same shape are not the same mask."""

    ACTIVATION = "gelu"

    def __init__(self, config: EncoderConfig, num_labels: int, make: LayerFactory, **kwargs):
        super().__init__(**kwargs)
        self.input_dropout = make.dropout(config.classifier_dropout, "input_dropout")
        self.dense = make.dense(config.hidden_size, "dense")
        self.activation = make.activation(self.ACTIVATION)
        self.hidden_dropout = make.dropout(config.classifier_dropout, "hidden_dropout")
        self.out_proj = make.dense(num_labels, "out_proj")

    def call(self, sequence, pooled, training=None):
        hidden = self.dense(self.input_dropout(sequence[:, 0], training=training))
        hidden = self.hidden_dropout(self.activation(hidden), training=training)
        return self.out_proj(hidden)


class RobertaSequenceHead(ElectraSequenceHead):
    """RobertaForSequenceClassification (RobertaClassificationHead): ELECTRA's head with tanh,
    on <s>: dropout -> dense -> tanh -> dropout -> out_proj."""

    ACTIVATION = "tanh"


class DebertaSequenceHead(tf_keras.layers.Layer):
    """DebertaV2ForSequenceClassification: ContextPooler (first token -> dropout
    (pooler_dropout) -> dense -> pooler_hidden_act), then dropout (cls_dropout, else
    hidden_dropout_prob) -> classifier."""

    def __init__(self, config: EncoderConfig, num_labels: int, make: LayerFactory, **kwargs):
        super().__init__(**kwargs)
        self.pooler_dropout = make.dropout(config.deberta.pooler_dropout, "pooler_dropout")
        self.pooler = make.dense(config.hidden_size, "pooler")
        self.activation = make.activation(config.deberta.pooler_hidden_act)
        self.dropout = make.dropout(config.classifier_dropout)
        self.classifier = make.dense(num_labels, "classifier")

    def call(self, sequence, pooled, training=None):
        pooled = self.pooler(self.pooler_dropout(sequence[:, 0], training=training))
        return self.classifier(self.dropout(self.activation(pooled), training=training))


class TokenHead(tf_keras.layers.Layer):
    """BertForTokenClassification, DistilBertForTokenClassification,
    ElectraForTokenClassification, RobertaForTokenClassification and
    DebertaV2ForTokenClassification, one shape for all: every token -> dropout -> classifier.
    The dropout rate is the family's: BERT's and ELECTRA's classifier_dropout
    (hidden_dropout_prob when unset), DistilBERT's `dropout` (not seq_classif_dropout, which
    only its sequence head uses), DeBERTa's hidden_dropout_prob (not cls_dropout)."""

    def __init__(self, config: EncoderConfig, num_labels: int, make: LayerFactory, **kwargs):
        super().__init__(**kwargs)
        rate = (config.hidden_dropout if config.family in ("distilbert", "deberta-v2")
                else config.classifier_dropout)
        self.dropout = make.dropout(rate)
        self.classifier = make.dense(num_labels, "classifier")

    def call(self, sequence, pooled, training=None):
        return self.classifier(self.dropout(sequence, training=training))


HEADS = {SEQUENCE_CLASSIFICATION: {"bert": BertSequenceHead,
                                   "distilbert": DistilBertSequenceHead,
                                   "electra": ElectraSequenceHead,
                                   "roberta": RobertaSequenceHead,
                                   "deberta-v2": DebertaSequenceHead},
         TOKEN_CLASSIFICATION: {"bert": TokenHead, "distilbert": TokenHead,
                                "electra": TokenHead, "roberta": TokenHead,
                                "deberta-v2": TokenHead}}


def build_head(task: str, config: EncoderConfig, num_labels: int,
               make: LayerFactory) -> tf_keras.layers.Layer:
    if task not in HEADS:
        raise ValueError(f"unknown task {task!r}; known: {', '.join(HEADS)}")
    return HEADS[task][config.encoder_family](config, num_labels, make, name="head")
