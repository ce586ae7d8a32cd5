"""Peer side of benchmarks/quality.py: the Hugging Face recipe, transformers' Trainer with its
defaults (torch's fused AdamW `adamw_torch_fused`, epsilon 1e-8, gradient clipping at norm 1.0,
linear schedule, random batches (group_by_length=False), a checkpoint every 500 steps
and a full one at the last step (save_strategy "steps"); the optimizer it used is recorded as
`optim`) plus the settings a
user of the recipe sets: epochs, batch, learning rate, warm-up ratio, weight decay, bf16,
seed; `--group-by-length` turns on the Trainer's length-grouped sampler. At the end it saves
the model (`trainer.save_model`, as a pipeline keeps its result) into --output-dir, which the
driver deletes. Runs in .venv-peer (torch, no TensorFlow).

Reads the driver's train/eval JSON Lines (the rows bertflow's data step reads), tokenizes
with BertTokenizerFast (truncation at --max-seq-length, dynamic padding), trains from
--model-dir, predicts the eval rows and prints one line `RESULT {json}` with the task's metrics
and step times. --task:

- classification (`{"text", "label"}`): BertForSequenceClassification; accuracy, macro-F1
  (same formula as tasks/steps/evaluate.py).
- multi_label (`{"text", "labels": [names]}`): AutoModelForSequenceClassification with
  problem_type="multi_label_classification" (BCEWithLogitsLoss) on float multi-hot labels
  over the sorted training names; a label is predicted where its sigmoid is over 0.5.
  micro-F1, macro-F1, subset accuracy by bertflow's own formula
  (tasks.task_kinds.multi_label_metrics).
- token_classification (`{"tokens", "tags"}`): AutoModelForTokenClassification with
  DataCollatorForTokenClassification, as transformers' run_ner: words tokenized with
  is_split_into_words, the first word piece of each word labelled, the others -100
  (label_all_tokens=False); tags "O" then the B-/I- tags sorted, as bertflow's
  tasks.io.token_readers.tag_vocabulary. Entity precision, recall, F1 (micro) and macro-F1
  by bertflow's conlleval-exact scorer (tasks/training/entity_metrics.py, count_entity_ids
  and entity_scores): both sides are scored by one scorer.

Classification only (benchmarks/class_weights.py): `--class-weights FILE` (a JSON object from
label name to weight) trains with a weighted `torch.nn.CrossEntropyLoss(weight=)` in an
overridden `Trainer.compute_loss`, as the Trainer's users write it (transformers #7024);
`--per-class` adds each class's precision, recall, F1 and support to the result.

The scorers are imported from the checkout (pure Python and numpy; no TensorFlow).
"""
import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch
from transformers import (AutoModelForSequenceClassification, AutoModelForTokenClassification,
                          BertForSequenceClassification, BertTokenizerFast,
                          DataCollatorForTokenClassification, Trainer, TrainingArguments)

# bertflow's scorers (tasks/task_kinds.py, tasks/training/entity_metrics.py import numpy only)
# are importable: the driver puts the checkout on PYTHONPATH.

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
p.add_argument("--group-by-length", action="store_true",
               help="the Trainer's LengthGroupedSampler (its default is random batches)")
p.add_argument("--output-dir", default=None,
               help="checkpoints and the saved model (default: a new temporary folder)")
p.add_argument("--task", default="classification",
               choices=("classification", "multi_label", "token_classification"))
p.add_argument("--class-weights", default=None,
               help="classification: a JSON file, label name -> weight, for a weighted loss")
p.add_argument("--per-class", action="store_true",
               help="classification: each class's precision, recall, F1 and support too")
a = p.parse_args()
if (a.class_weights or a.per_class) and a.task != "classification":
    p.error("--class-weights and --per-class apply to --task classification")
times = {}


def read(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def vocabulary(rows):
    """The label names in model output order (bertflow's order for each task)."""
    if a.task == "classification":
        return sorted({r["label"] for r in rows})
    if a.task == "multi_label":
        return sorted({name for r in rows for name in r["labels"]})
    types = {tag[2:] for r in rows for tag in r["tags"] if tag != "O"}
    return ["O"] + sorted(f"{prefix}-{kind}" for kind in types for prefix in "BI")


def target(row):
    """A row's `labels` feature: the class index, the float multi-hot vector, or one tag id
    per word (a tag the training rows lack is an error, as in bertflow's data step)."""
    if a.task == "classification":
        return index[row["label"]]
    if a.task == "multi_label":
        hot = [0.0] * len(labels)
        for name in row["labels"]:
            hot[index[name]] = 1.0
        return hot
    return [index[tag] for tag in row["tags"]]


t0 = time.perf_counter()
train_rows, eval_rows = read(a.train), read(a.eval)
labels = vocabulary(train_rows)
index = {label: i for i, label in enumerate(labels)}
times["data"] = time.perf_counter() - t0

t0 = time.perf_counter()
tokenizer = BertTokenizerFast.from_pretrained(a.model_dir)


def encode(rows):
    if a.task == "token_classification":
        return encode_words(rows)
    enc = tokenizer([r["text"] for r in rows], truncation=True, max_length=a.max_seq_length)
    return [{"input_ids": ids, "token_type_ids": tt, "attention_mask": am,
             "labels": target(r)}
            for ids, tt, am, r in zip(enc["input_ids"], enc["token_type_ids"],
                                      enc["attention_mask"], rows)]


def encode_words(rows):
    """run_ner's tokenize_and_align_labels with label_all_tokens=False."""
    enc = tokenizer([r["tokens"] for r in rows], truncation=True,
                    max_length=a.max_seq_length, is_split_into_words=True)
    out = []
    for i, r in enumerate(rows):
        tags, previous, aligned = target(r), None, []
        for word in enc.word_ids(i):
            aligned.append(-100 if word is None or word == previous else tags[word])
            previous = word
        out.append({"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
                    "attention_mask": enc["attention_mask"][i], "labels": aligned})
    return out


train_set, eval_set = encode(train_rows), encode(eval_rows)
times["tokenize"] = time.perf_counter() - t0

t0 = time.perf_counter()
names = {"num_labels": len(labels), "id2label": dict(enumerate(labels)), "label2id": index}
if a.task == "classification":
    model = BertForSequenceClassification.from_pretrained(a.model_dir, **names)
elif a.task == "multi_label":
    model = AutoModelForSequenceClassification.from_pretrained(
        a.model_dir, problem_type="multi_label_classification", **names)
else:
    model = AutoModelForTokenClassification.from_pretrained(a.model_dir, **names)
out = a.output_dir or tempfile.mkdtemp(prefix="peer-quality-")
args = TrainingArguments(
    output_dir=out, num_train_epochs=a.epochs, max_steps=a.max_steps,
    per_device_train_batch_size=a.batch_size, per_device_eval_batch_size=64,
    learning_rate=a.learning_rate, warmup_ratio=a.warmup_ratio, weight_decay=a.weight_decay,
    bf16=not a.no_bf16, group_by_length=a.group_by_length, seed=a.seed, use_cpu=True,
    eval_strategy="no", report_to="none", logging_strategy="epoch",
    disable_tqdm=True)  # save_strategy, save_steps: the defaults (every 500 steps)
collator = (DataCollatorForTokenClassification(tokenizer)
            if a.task == "token_classification" else None)  # None: padding by the tokenizer


class WeightedLossTrainer(Trainer):
    """The Trainer with a class-weighted cross-entropy, as its users write it: torch's
    CrossEntropyLoss(weight=), whose mean divides by the batch's summed weights."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        targets = inputs.pop("labels")
        outputs = model(**inputs)
        # float32: under bf16 autocast the logits are bf16, the weights float32
        loss = torch.nn.CrossEntropyLoss(weight=class_weights)(
            outputs.logits.float().view(-1, len(labels)), targets.view(-1))
        return (loss, outputs) if return_outputs else loss


class_weights = None
if a.class_weights:
    with open(a.class_weights, encoding="utf-8") as f:
        by_name = json.load(f)
    if sorted(by_name) != labels:
        sys.exit(f"--class-weights {a.class_weights}: its labels are not the training rows' "
                 f"{labels}")
    class_weights = torch.tensor([float(by_name[name]) for name in labels])
trainer = (WeightedLossTrainer if a.class_weights else Trainer)(
    model=model, args=args, train_dataset=train_set, processing_class=tokenizer,
    data_collator=collator)
train_out = trainer.train()
trainer.save_model(os.path.join(out, "model"))
times["train"] = time.perf_counter() - t0


def class_metrics(pred) -> dict:
    """classification: accuracy and macro-F1."""
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
    out = {"accuracy": float(correct.sum() / matrix.sum()), "macro_f1": float(f1.mean())}
    if a.per_class:  # the fields of bertflow's metrics.json per_class
        out["per_class"] = {name: {"precision": float(precision[i]), "recall": float(recall[i]),
                                   "f1": float(f1[i]), "support": int(matrix[i].sum())}
                            for i, name in enumerate(labels)}
    return out


def task_metrics(pred) -> dict:
    """The task's metrics (multi_label and token_classification: by bertflow's scorers)."""
    if a.task == "classification":
        return class_metrics(pred)
    logits, truth = np.asarray(pred.predictions, np.float32), np.asarray(pred.label_ids)
    if a.task == "multi_label":
        from tasks.task_kinds import multi_label_metrics

        predicted, truth = logits > 0.0, truth > 0.5  # sigmoid(x) > 0.5 <=> x > 0
        counts = {"per_label": [(predicted & truth).sum(0), (predicted & ~truth).sum(0),
                                (~predicted & truth).sum(0)],
                  "exact": int((predicted == truth).all(1).sum()), "rows": len(truth)}
        found = multi_label_metrics(counts, labels, 0.5)
        return {k: found[k] for k in ("micro_f1", "macro_f1", "subset_accuracy")}
    from tasks.training.entity_metrics import count_entity_ids, entity_scores, entity_types

    # Trainer pads the label rows of its batches with -100: those positions never count.
    counts = count_entity_ids(truth, logits.argmax(-1), labels)
    found = entity_scores(counts, entity_types(labels))
    return {k: found[k] for k in ("f1", "precision", "recall", "macro_f1")}


t0 = time.perf_counter()
scores = task_metrics(trainer.predict(eval_set))
times["evaluate"] = time.perf_counter() - t0

print("RESULT " + json.dumps({
    **scores, **({} if a.task == "classification" else {"task": a.task}),
    "num_train_examples": len(train_set), "num_eval_examples": len(eval_set),
    "train_steps": int(train_out.global_step), "final_loss": [h["loss"] for h in trainer.state.log_history if "loss" in h][-1],
    "step_seconds": times, "adam_epsilon": args.adam_epsilon,
    # the Trainer's names (adamw_torch_fused, linear), not the enums' reprs
    "optim": getattr(args.optim, "value", str(args.optim)),
    "lr_scheduler": getattr(args.lr_scheduler_type, "value", str(args.lr_scheduler_type)),
    "max_grad_norm": args.max_grad_norm, "group_by_length": args.group_by_length,
    "save_strategy": getattr(args.save_strategy, "value", str(args.save_strategy)),
    "save_steps": args.save_steps,
    **({"class_weights": {name: float(w) for name, w in zip(labels, class_weights.tolist())}}
       if class_weights is not None else {}),
    "warmup_ratio": a.warmup_ratio, "weight_decay": a.weight_decay, "bf16": not a.no_bf16,
    "threads": torch.get_num_threads(), "torch": torch.__version__}))
sys.stdout.flush()
