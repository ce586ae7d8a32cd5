"""The encoder: embeddings, transformer blocks and (BERT's) pooler."""
from __future__ import annotations

import tf_keras

from tasks.model.config import EncoderConfig
from tasks.model.deberta import DebertaEncoder
from tasks.model.layers import Embeddings, LayerFactory, TransformerBlock, attention_bias


class Encoder(tf_keras.layers.Layer):
    """`features` (input_ids, and optionally attention_mask and token_type_ids: int
    [batch, seq]) -> (last hidden state [batch, seq, hidden], pooled output [batch, hidden]
    or None). The pooled output is BERT's pooler (dense + tanh on the first token); DistilBERT
    and ELECTRA have none, nor has a BERT built `with_pooler=False` (as transformers'
    BertForTokenClassification builds its BertModel). DistilBERT ignores token_type_ids."""

    def __init__(self, config: EncoderConfig, make: LayerFactory, with_pooler: bool = True,
                 **kwargs):
        super().__init__(**kwargs)
        self.embeddings = Embeddings(config, make, name="embeddings")
        self.blocks = [TransformerBlock(config, make, config.encoder_family != "distilbert",
                                        name=f"block_{i}") for i in range(config.num_layers)]
        self.pooler = (make.dense(config.hidden_size, "pooler", activation="tanh")
                       if config.encoder_family == "bert" and with_pooler else None)

    def call(self, features, training=None):
        hidden = self.embeddings(features, training=training)
        # Built once for all blocks, in the compute dtype.
        bias = attention_bias(features.get("attention_mask"), hidden.dtype)
        for block in self.blocks:
            hidden = block(hidden, bias, training=training)
        pooled = None if self.pooler is None else self.pooler(hidden[:, 0])
        return hidden, pooled


# Families whose encoder is not BERT's shape; the others are Encoder's.
ENCODERS = {"deberta-v2": DebertaEncoder}


def build_encoder(config: EncoderConfig, make: LayerFactory, with_pooler: bool,
                  name: str) -> tf_keras.layers.Layer:
    """The encoder of `config.family`: called with features, returns (sequence, pooled or
    None)."""
    return ENCODERS.get(config.family, Encoder)(config, make, with_pooler=with_pooler,
                                                  name=name)
