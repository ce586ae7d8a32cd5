"""DeBERTa-v2/v3's settings (transformers' model_type "deberta-v2"), read from config.json.

Keys a config.json leaves out take DebertaV2Config's defaults, or the defaults of the
`getattr(config, key, default)` reads in transformers' modeling_deberta_v2.py (position_buckets,
share_att_key, norm_rel_ebd), as `from_pretrained` does. What bertflow's encoder does not
build is refused naming the field. No TensorFlow here: validate reads configs.
"""
from __future__ import annotations

from dataclasses import dataclass

from tasks.errors import ConfigError

FAMILY = "deberta-v2"
# Attention terms bertflow builds: content-to-position and position-to-content. "p2p" is
# in DeBERTa's paper and code base but in no released checkpoint nor transformers' model.
POSITION_ATTENTION = ("c2p", "p2c")

DEFAULTS = dict(vocab_size=128100, hidden_size=1536, num_hidden_layers=24,
                num_attention_heads=24, intermediate_size=6144, hidden_act="gelu",
                hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                max_position_embeddings=512, type_vocab_size=0, initializer_range=0.02,
                layer_norm_eps=1e-7, relative_attention=False, max_relative_positions=-1,
                pad_token_id=0, position_biased_input=True, pos_att_type=None,
                pooler_dropout=0.0, pooler_hidden_act="gelu", cls_dropout=None,
                position_buckets=-1, share_att_key=False, norm_rel_ebd="none",
                conv_kernel_size=0)


@dataclass(frozen=True)
class DebertaOptions:
    relative_attention: bool
    position_buckets: int  # <= 0: no log buckets, relative positions clipped at the span
    max_relative_positions: int  # max_position_embeddings when the config says < 1
    share_att_key: bool  # position projections are the content query and key projections
    pos_att_type: tuple[str, ...]  # some of POSITION_ATTENTION
    norm_rel_embeddings: bool  # norm_rel_ebd "layer_norm": LayerNorm on rel_embeddings
    position_biased_input: bool  # absolute position embeddings added to the input
    pooler_hidden_act: str
    pooler_dropout: float

    @property
    def attention_span(self) -> int:
        """transformers' pos_ebd_size: rel_embeddings has twice as many rows."""
        return self.position_buckets if self.position_buckets > 0 else \
            self.max_relative_positions

    @property
    def scale_factor(self) -> int:
        """Scores are divided by sqrt(head_size * scale_factor): one term per attention
        type, whether relative attention is on or not (as transformers does)."""
        return 1 + len(self.pos_att_type)


def read(raw: dict) -> DebertaOptions:
    """config.json's DeBERTa options, DebertaV2Config's defaults filled in."""
    c = {**DEFAULTS, **raw}
    kinds = c["pos_att_type"] or []
    if isinstance(kinds, str):
        kinds = kinds.lower().split("|")
    kinds = tuple(kind.strip() for kind in kinds)
    unsupported = [kind for kind in kinds if kind not in POSITION_ATTENTION]
    _refuse(unsupported, "pos_att_type", f"{unsupported} is not supported (supported: "
                                         f"{', '.join(POSITION_ATTENTION)})")
    _refuse(c["conv_kernel_size"] > 0, "conv_kernel_size",
            "DeBERTa-v2's convolution layer is not supported (DeBERTa-v3 has none)")
    _refuse(c.get("embedding_size", c["hidden_size"]) != c["hidden_size"], "embedding_size",
            "an embedding size other than hidden_size is not supported")
    _refuse(c.get("pooler_hidden_size", c["hidden_size"]) != c["hidden_size"],
            "pooler_hidden_size", "a pooler size other than hidden_size is not supported")
    head_size = c["hidden_size"] // max(c["num_attention_heads"], 1)
    _refuse(c.get("attention_head_size", head_size) != head_size, "attention_head_size",
            "must be hidden_size / num_attention_heads")
    norms = {part.strip() for part in str(c["norm_rel_ebd"]).lower().split("|")}
    _refuse(norms - {"none", "layer_norm"}, "norm_rel_ebd",
            f"{c['norm_rel_ebd']!r} is not supported (supported: none, layer_norm)")
    max_relative = c["max_relative_positions"]
    return DebertaOptions(
        relative_attention=bool(c["relative_attention"]),
        position_buckets=int(c["position_buckets"]),
        max_relative_positions=(max_relative if max_relative >= 1
                                else c["max_position_embeddings"]),
        share_att_key=bool(c["share_att_key"]), pos_att_type=kinds,
        norm_rel_embeddings="layer_norm" in norms,
        position_biased_input=bool(c["position_biased_input"]),
        pooler_hidden_act=c["pooler_hidden_act"], pooler_dropout=float(c["pooler_dropout"]))


def _refuse(condition, key: str, why: str) -> None:
    if condition:
        raise ConfigError("base_model", f"config.json: {FAMILY} {key}: {why}")
