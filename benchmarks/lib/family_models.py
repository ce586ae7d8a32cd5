"""The published shapes of the encoder families train_throughput.py compares (issue 45), and
checkpoints of them with RANDOM weights (no checkpoint can be downloaded here; training speed
depends on the shapes only), written by bertflow's own saver so that both sides load them:
bertflow's train step by name, the peer with AutoModelForSequenceClassification.

Each config is the checkpoint's published config.json (the model card's files on the Hub), the
keys it leaves out taking transformers' config class defaults, as `from_pretrained` does.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

# Each family's shape keys as bert-base's: 12 layers, hidden 768, 12 heads, FFN 3072.
_BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
         "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
         "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02}
# FacebookAI/roberta-base config.json: vocab 50265, 514 positions (512 + pad + 1), one token
# type, eps 1e-5, pad 1 (RobertaConfig's pad_token_id default too), <s> 0, </s> 2.
_ROBERTA = {**_BASE, "model_type": "roberta", "vocab_size": 50265,
            "max_position_embeddings": 514, "type_vocab_size": 1, "layer_norm_eps": 1e-5,
            "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}
# FacebookAI/xlm-roberta-base config.json: roberta-base's but for its 250,002 ids (fairseq's
# dictionary of the 250,000 SentencePiece pieces plus <s> <pad> </s> <unk> <mask>).
_XLM_ROBERTA = {**_ROBERTA, "model_type": "xlm-roberta", "vocab_size": 250002}
# microsoft/deberta-v3-base config.json: 128,100 ids (128,000 pieces, rows to spare),
# relative attention only (position_biased_input false: no absolute positions), 256 log
# position buckets, max_relative_positions -1 (then max_position_embeddings, 512), p2c|c2p,
# shared attention keys, LayerNorm'ed relative embeddings, no token types, eps 1e-7, pad 0.
_DEBERTA_V3 = {**_BASE, "model_type": "deberta-v2", "vocab_size": 128100,
               "max_position_embeddings": 512, "relative_attention": True,
               "position_buckets": 256, "max_relative_positions": -1,
               "pos_att_type": "p2c|c2p", "share_att_key": True, "norm_rel_ebd": "layer_norm",
               "position_biased_input": False, "type_vocab_size": 0, "layer_norm_eps": 1e-7,
               "pad_token_id": 0}
# --model name -> (tokenizer family of benchmarks/tokenizer_parity.py, config.json)
MODELS = {"roberta-base": ("roberta", _ROBERTA),
          "xlm-roberta-base": ("xlm-roberta", _XLM_ROBERTA),
          "deberta-v3-base": ("deberta-v2", _DEBERTA_V3)}
# --smoke: the same options at a tiny shape (vocab_size: the smoke tokenizer's)
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 64}
# microsoft/deberta-v3-base tokenizer_config.json: its SentencePiece model keeps case.
TOKENIZER_CONFIGS = {"deberta-v2": {"do_lower_case": False, "vocab_type": "spm"}}


def config(name: str, tiny_vocab: int | None = None) -> dict:
    """The published config.json of `name`, or (tiny_vocab) its options at TINY's shape."""
    raw = dict(MODELS[name][1])
    if tiny_vocab is not None:
        raw.update(TINY, vocab_size=tiny_vocab)
    return raw


def write_checkpoint(raw: dict, tokenizer_dir: Path, out: Path, seed: int = 0) -> Path:
    """`out`: bertflow's freshly initialised (RANDOM, `seed`) 2-label classifier of config
    `raw`, saved by tasks.model.random_checkpoint (config.json and model.safetensors under
    transformers' names), and the tokenizer files of `tokenizer_dir`. Imports TensorFlow:
    run it in a process of its own."""
    from tasks.model.random_checkpoint import save_random_classifier

    save_random_classifier(raw, seed, ["0", "1"], out)
    for path in Path(tokenizer_dir).iterdir():
        shutil.copy(path, out / path.name)
    family_config = TOKENIZER_CONFIGS.get(raw["model_type"])
    if family_config:
        (out / "tokenizer_config.json").write_text(json.dumps(family_config))
    return out
