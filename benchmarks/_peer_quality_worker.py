"""Peer side of benchmarks/quality.py: the Hugging Face recipe, transformers' Trainer with its
defaults (torch's fused AdamW `adamw_torch_fused`, epsilon 1e-8, gradient clipping at norm 1.0,
linear schedule; the optimizer it used is recorded as `optim`) plus the
settings a user of the recipe sets: epochs, batch, learning rate, warm-up ratio, weight
decay, bf16, group_by_length, seed. Runs in .venv-peer (torch, no TensorFlow).

Reads the driver's train/eval JSON Lines (`{"text", "label"}`, the rows bertflow's data step
reads), tokenizes with BertTokenizerFast (truncation at --max-seq-length, dynamic padding),
trains BertForSequenceClassification from --model-dir, predicts the eval rows and prints one
line `RESULT {json}`: accuracy, macro-F1 (same formula as tasks/steps/evaluate.py), step times.
"""
import argparse
import json
import sys
import tempfile
import time

import numpy as np
import torch
from transformers import (BertForSequenceClassification, BertTokenizerFast, Trainer,
                          TrainingArguments)

p = argparse.ArgumentParser()
p.add_argument("--train", required=True)
p.add_argument("--eval", required=True)
p.add_argument("--model-dir", required=True)
p.add_argument("--epochs", type=float, default=1)
p.add_argument("--max-steps", type=int, default=-1)
p.add_argument("--batch-size", type=int, default=32)
p.add_argument("--learning-rate", type=float, default=5e-5)
p.add_argument("--warmup-ratio", type=float, default=0.06)
p.add_argument("--weight-decay", type=float, default=0.01)
p.add_argument("--max-seq-length", type=int, default=128)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--no-bf16", action="store_true")
a = p.parse_args()
times = {}


def read(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


t0 = time.perf_counter()
train_rows, eval_rows = read(a.train), read(a.eval)
labels = sorted({r["label"] for r in train_rows})
index = {label: i for i, label in enumerate(labels)}
times["data"] = time.perf_counter() - t0

t0 = time.perf_counter()
tokenizer = BertTokenizerFast.from_pretrained(a.model_dir)


def encode(rows):
    enc = tokenizer([r["text"] for r in rows], truncation=True, max_length=a.max_seq_length)
    return [{"input_ids": ids, "token_type_ids": tt, "attention_mask": am,
             "labels": index[r["label"]]}
            for ids, tt, am, r in zip(enc["input_ids"], enc["token_type_ids"],
                                      enc["attention_mask"], rows)]


train_set, eval_set = encode(train_rows), encode(eval_rows)
times["tokenize"] = time.perf_counter() - t0

t0 = time.perf_counter()
model = BertForSequenceClassification.from_pretrained(
    a.model_dir, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id=index)
out = tempfile.mkdtemp(prefix="peer-quality-")
args = TrainingArguments(
    output_dir=out, num_train_epochs=a.epochs, max_steps=a.max_steps,
    per_device_train_batch_size=a.batch_size, per_device_eval_batch_size=64,
    learning_rate=a.learning_rate, warmup_ratio=a.warmup_ratio, weight_decay=a.weight_decay,
    bf16=not a.no_bf16, group_by_length=True, seed=a.seed, use_cpu=True,
    save_strategy="no", eval_strategy="no", report_to="none", logging_strategy="epoch",
    disable_tqdm=True)
trainer = Trainer(model=model, args=args, train_dataset=train_set, processing_class=tokenizer)
train_out = trainer.train()
times["train"] = time.perf_counter() - t0

t0 = time.perf_counter()
pred = trainer.predict(eval_set)
predicted = np.asarray(pred.predictions).argmax(-1)
# With group_by_length, Trainer also orders the eval rows by length: labels come with them.
truth = np.asarray(pred.label_ids)
assert sorted(truth.tolist()) == sorted(r["labels"] for r in eval_set)
matrix = np.zeros([len(labels), len(labels)], np.int64)
np.add.at(matrix, (truth, predicted), 1)
correct = np.diag(matrix).astype(float)


def ratio(num, den):
    res = np.zeros_like(num, dtype=float)
    np.divide(num, den, out=res, where=den > 0)
    return res


precision, recall = ratio(correct, matrix.sum(0)), ratio(correct, matrix.sum(1))
f1 = ratio(2 * precision * recall, precision + recall)
times["evaluate"] = time.perf_counter() - t0

print("RESULT " + json.dumps({
    "accuracy": float(correct.sum() / matrix.sum()), "macro_f1": float(f1.mean()),
    "num_train_examples": len(train_set), "num_eval_examples": len(eval_set),
    "train_steps": int(train_out.global_step), "final_loss": [h["loss"] for h in trainer.state.log_history if "loss" in h][-1],
    "step_seconds": times, "adam_epsilon": args.adam_epsilon,
    # the Trainer's names (adamw_torch_fused, linear), not the enums' reprs
    "optim": getattr(args.optim, "value", str(args.optim)),
    "lr_scheduler": getattr(args.lr_scheduler_type, "value", str(args.lr_scheduler_type)),
    "max_grad_norm": args.max_grad_norm,
    "warmup_ratio": a.warmup_ratio, "weight_decay": a.weight_decay, "bf16": not a.no_bf16,
    "threads": torch.get_num_threads(), "torch": torch.__version__}))
sys.stdout.flush()
