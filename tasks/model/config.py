"""The encoder's shape and settings, read from a Hugging Face config.json (no transformers).

Keys a config.json leaves out take the defaults of transformers' config class for its family
(BertConfig, DistilBertConfig, ElectraConfig, RobertaConfig, XLMRobertaConfig,
DebertaV2Config), as `from_pretrained` does.

FAMILIES are the families a run can fine-tune: one row each in tasks/model/families.py, each
with its encoder and its in-graph tokenizer (TOKENIZER_FILES).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from tasks.errors import ConfigError
from tasks.model import deberta_config, families
from tasks.model.deberta_config import DebertaOptions

# The family tables (tasks/model/families.py), in the shapes this module's readers take.
FAMILIES = tuple(families.FAMILIES)
# Families whose encoder, heads and weight names are another family's: transformers' XLM-R
# classes are RoBERTa's (the same modules, under the same `roberta.` prefix).
ENCODER_FAMILY = {f.name: f.encoder_family for f in families.ROWS if f.encoder_family}
ACTIVATIONS = ("gelu", "gelu_new", "relu")
# transformers' class of each family by task (the task names of tasks.model.heads).
TASK_ARCHITECTURES = {f"{task}_classification": {
    f.name: f"{f.architecture}For{kind}Classification" for f in families.ROWS}
    for task, kind in (("sequence", "Sequence"), ("token", "Token"))}
ARCHITECTURES = TASK_ARCHITECTURES["sequence_classification"]
# Each family's tokenizer files, in the order its text encoder reads them.
WORDPIECE_FILES = families.WORDPIECE_FILES
TOKENIZER_FILES = {f.name: f.tokenizer_files for f in families.ROWS}
# A Hub checkpoint of each family, for the messages that refuse another (docs/model.md).
EXAMPLES = {f.name: f.example for f in families.ROWS}
# The module prefix of each encoder family in transformers' checkpoints (base_model_prefix).
PREFIXES = {f.name: f.weight_prefix for f in families.ROWS if f.weight_prefix}
# What a config needs to be read as BERT's when it names no model_type (early checkpoints).
BERT_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")

_BERT_DEFAULTS = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12,
                      num_attention_heads=12, intermediate_size=3072, hidden_act="gelu",
                      hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                      max_position_embeddings=512, type_vocab_size=2, initializer_range=0.02,
                      layer_norm_eps=1e-12, pad_token_id=0, position_embedding_type="absolute",
                      classifier_dropout=None)
_ELECTRA_DEFAULTS = {**_BERT_DEFAULTS, "embedding_size": 128, "hidden_size": 256,
                     "num_attention_heads": 4, "intermediate_size": 1024}
# RobertaConfig's own defaults are BertConfig's but for the special tokens' ids; released
# RoBERTa configs set 514 positions, 1 token type and eps 1e-5 themselves.
_ROBERTA_DEFAULTS = {**_BERT_DEFAULTS, "vocab_size": 50265, "pad_token_id": 1}
_XLM_ROBERTA_DEFAULTS = {**_BERT_DEFAULTS, "pad_token_id": 1}  # XLMRobertaConfig's
_DISTILBERT_DEFAULTS = dict(vocab_size=30522, max_position_embeddings=512,
                            sinusoidal_pos_embds=False, n_layers=6, n_heads=12, dim=768,
                            hidden_dim=3072, dropout=0.1, attention_dropout=0.1,
                            activation="gelu", initializer_range=0.02, seq_classif_dropout=0.2,
                            pad_token_id=0)


@dataclass(frozen=True)
class EncoderConfig:
    family: str  # one of FAMILIES: config.json's model_type
    vocab_size: int
    hidden_size: int
    embedding_size: int  # ELECTRA's may be smaller than hidden_size, then projected
    num_layers: int
    num_heads: int
    intermediate_size: int
    hidden_act: str
    max_position_embeddings: int
    # DistilBERT's sinusoidal position table is stored with the weights but never trained.
    frozen_positions: bool
    type_vocab_size: int  # 0: no token type embeddings (DistilBERT)
    layer_norm_eps: float
    hidden_dropout: float
    attention_dropout: float
    classifier_dropout: float
    initializer_range: float
    pad_token_id: int
    deberta: DebertaOptions | None = None  # DeBERTa-v2/v3's attention and pooler settings
    raw: dict = field(default_factory=dict, repr=False, compare=False)  # the config.json

    @property
    def prefix(self) -> str:
        """The encoder's module prefix in transformers' checkpoints ("bert", "deberta"; XLM-R's
        is RoBERTa's)."""
        return PREFIXES.get(self.encoder_family, self.encoder_family)

    @classmethod
    def from_pretrained(cls, folder: Path | str) -> EncoderConfig:
        path = Path(folder) / "config.json"
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ConfigError("base_model", f"{path}: cannot read it ({err})") from None
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict) -> EncoderConfig:
        """The config of `raw`, of a family a run can fine-tune (FAMILIES)."""
        family = raw.get("model_type")
        if family is None and all(key in raw for key in BERT_KEYS):
            family = "bert"
        if family not in FAMILIES:
            found = f"model_type {family!r}" if family else "no model_type"
            raise ConfigError("base_model", f"config.json has {found}; supported: "
                                            f"{', '.join(FAMILIES)} (e.g. "
                                            f"{', '.join(EXAMPLES[f] for f in FAMILIES)})")
        config = (_distilbert(raw) if family == "distilbert" else
                  _deberta(raw) if family == deberta_config.FAMILY else
                  _bert_shaped(family, raw))
        config._check()
        return config

    @property
    def encoder_family(self) -> str:
        """The family whose encoder, heads and weight layout this one has (itself, or
        ENCODER_FAMILY's: RoBERTa's for XLM-R)."""
        return ENCODER_FAMILY.get(self.family, self.family)

    def _check(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ConfigError("base_model", f"config.json: hidden size {self.hidden_size} is "
                                            f"not a multiple of {self.num_heads} heads")
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError("base_model", f"config.json: activation {self.hidden_act!r} is "
                                            f"not supported (supported: {', '.join(ACTIVATIONS)})")
        pooler_act = self.deberta and self.deberta.pooler_hidden_act
        if pooler_act and pooler_act not in (*ACTIVATIONS, "tanh"):
            raise ConfigError("base_model", f"config.json: pooler_hidden_act {pooler_act!r} is "
                                            f"not supported (supported: "
                                            f"{', '.join(ACTIVATIONS)}, tanh)")

    def to_hf_config(self, labels: list[str],
                     problem_type: str = "single_label_classification",
                     task: str = "sequence_classification") -> dict:
        """config.json of the classifier: the original config with this family's
        architecture for `task` and the labels in output order. `problem_type` is what
        transformers' sequence classification reads; token classification has none."""
        config = {key: value for key, value in self.raw.items() if key != "num_labels"}
        if task == "token_classification":
            problem_type = None
        config.update(model_type=self.family,
                      architectures=[TASK_ARCHITECTURES[task][self.family]],
                      id2label={str(i): label for i, label in enumerate(labels)},
                      label2id={label: i for i, label in enumerate(labels)},
                      problem_type=problem_type)
        return config


def _bert_shaped(family: str, raw: dict) -> EncoderConfig:
    """BERT, ELECTRA, RoBERTa, XLM-R and DeBERTa: the same keys; ELECTRA's embeddings may be
    narrower."""
    defaults = {"electra": _ELECTRA_DEFAULTS, "roberta": _ROBERTA_DEFAULTS,
                "xlm-roberta": _XLM_ROBERTA_DEFAULTS,
                deberta_config.FAMILY: {**_BERT_DEFAULTS, **deberta_config.DEFAULTS}}
    c = {**defaults.get(family, _BERT_DEFAULTS), **raw}
    if c["position_embedding_type"] != "absolute":
        raise ConfigError("base_model", f"config.json: position_embedding_type "
                                        f"{c['position_embedding_type']!r} is not supported "
                                        f"(supported: absolute)")
    dropout = c["classifier_dropout"]
    return EncoderConfig(
        family=family, vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
        embedding_size=c.get("embedding_size", c["hidden_size"]),
        num_layers=c["num_hidden_layers"], num_heads=c["num_attention_heads"],
        intermediate_size=c["intermediate_size"], hidden_act=c["hidden_act"],
        max_position_embeddings=c["max_position_embeddings"], frozen_positions=False,
        type_vocab_size=c["type_vocab_size"], layer_norm_eps=c["layer_norm_eps"],
        hidden_dropout=c["hidden_dropout_prob"],
        attention_dropout=c["attention_probs_dropout_prob"],
        classifier_dropout=c["hidden_dropout_prob"] if dropout is None else dropout,
        initializer_range=c["initializer_range"], pad_token_id=c["pad_token_id"], raw=dict(raw))


def _distilbert(raw: dict) -> EncoderConfig:
    c = {**_DISTILBERT_DEFAULTS, **raw}
    return EncoderConfig(
        family="distilbert", vocab_size=c["vocab_size"], hidden_size=c["dim"],
        embedding_size=c["dim"], num_layers=c["n_layers"], num_heads=c["n_heads"],
        intermediate_size=c["hidden_dim"], hidden_act=c["activation"],
        max_position_embeddings=c["max_position_embeddings"],
        frozen_positions=bool(c["sinusoidal_pos_embds"]), type_vocab_size=0,
        layer_norm_eps=1e-12,  # fixed in transformers' DistilBERT, not in its config
        hidden_dropout=c["dropout"], attention_dropout=c["attention_dropout"],
        classifier_dropout=c["seq_classif_dropout"], initializer_range=c["initializer_range"],
        pad_token_id=c["pad_token_id"], raw=dict(raw))



def _deberta(raw: dict) -> EncoderConfig:
    """BERT's keys with DebertaV2Config's defaults; the head's dropout is cls_dropout."""
    options = deberta_config.read(raw)
    config = _bert_shaped(deberta_config.FAMILY,
                          {**raw, "classifier_dropout": raw.get("cls_dropout")})
    return dataclasses.replace(config, deberta=options, raw=dict(raw))
