"""Peer side of train_throughput (and mfu, model_sizes): HF transformers + PyTorch CPU with the
recipe of transformers 4.57's Trainer defaults, written out as its training step does it:
torch's fused AdamW (`adamw_torch_fused`, betas 0.9/0.999, epsilon 1e-8), learning rate 5e-5,
weight decay 0.0, gradient clipping at norm 1.0 (`max_grad_norm`), a linear schedule with no
warm-up (`warmup_ratio` 0.0) over every step this run takes, optional bf16 autocast (the
Trainer's `bf16=True`). Dynamic padding, length-grouped batches (given by the driver). Runs in
.venv-peer (no TensorFlow). `--plain-adamw` is the older peer (plain `torch.optim.AdamW`).
The model is the folder's family (AutoModelForSequenceClassification: BERT, RoBERTa, XLM-R,
DeBERTa-v3); rows are padded with its config's pad_token_id (RoBERTa's and XLM-R's is 1, as
the Trainer's data collator pads with the tokenizer's) and masked by their lengths.

Warm-up: by default one untimed pass over the driver's batches, then one timed pass over the
same batches (as the bertflow worker does), so both sides time the same shapes after the same
warm-up. Prints one line `RESULT {json}`, with `first_step_end_unix` (wall clock at the end of
the first step, so the driver can report start-up: process start to first step) and `recipe`,
after a line `MODEL {json}`: the family and shape it loaded and its parameter count.
"""
import argparse
import json
import sys
import time

import torch
from transformers import AutoModelForSequenceClassification

p = argparse.ArgumentParser()
p.add_argument("--batches", required=True)
p.add_argument("--model-dir", required=True)
p.add_argument("--bf16", action="store_true")
p.add_argument("--warmup", type=int, default=None,
               help="untimed steps; default one pass over the batches (as the bertflow side)")
p.add_argument("--threads", type=int, default=0)
p.add_argument("--learning-rate", type=float, default=5e-5)
p.add_argument("--weight-decay", type=float, default=0.0)
p.add_argument("--max-grad-norm", type=float, default=1.0)
# kept for old command lines: fused is the default now (the Trainer's adamw_torch_fused)
p.add_argument("--fused", action="store_true", help=argparse.SUPPRESS)
p.add_argument("--plain-adamw", action="store_true",
               help="plain torch.optim.AdamW instead of the Trainer's fused AdamW")
a = p.parse_args()
fused = not a.plain_adamw
if a.threads:
    torch.set_num_threads(a.threads)
torch.manual_seed(0)
batches = json.load(open(a.batches))["batches"]
if a.warmup is None:
    a.warmup = len(batches)
warmup_batches = [batches[i % len(batches)] for i in range(a.warmup)]
total_steps = a.warmup + len(batches)
model = AutoModelForSequenceClassification.from_pretrained(a.model_dir, num_labels=2)
model.train()
pad_id = model.config.pad_token_id or 0
# The Trainer's parameter groups: no decay on biases and LayerNorm weights (moot at 0.0).
decay = [p_ for n, p_ in model.named_parameters() if not ("bias" in n or "LayerNorm" in n)]
no_decay = [p_ for n, p_ in model.named_parameters() if "bias" in n or "LayerNorm" in n]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                         {"params": no_decay, "weight_decay": 0.0}],
                        lr=a.learning_rate, betas=(0.9, 0.999), eps=1e-8,
                        fused=True if fused else None)
# transformers' get_linear_schedule_with_warmup with 0 warm-up steps
sched = torch.optim.lr_scheduler.LambdaLR(
    opt, lambda s: max(0.0, (total_steps - s) / max(1, total_steps)))


def step(b):
    n = max(len(x) for x in b["input_ids"])
    ids = torch.full((len(b["input_ids"]), n), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, x in enumerate(b["input_ids"]):
        ids[i, :len(x)] = torch.tensor(x)
        mask[i, :len(x)] = 1
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
        loss = model(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids),
                     labels=torch.tensor(b["labels"])).loss
    loss.backward()
    if a.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.max_grad_norm)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return float(loss)


first_step_end = None
for b in warmup_batches:
    step(b)
    first_step_end = first_step_end or time.time()
t0 = time.perf_counter()
step_seconds = []
for b in batches:
    t1 = time.perf_counter()
    loss = step(b)
    step_seconds.append(time.perf_counter() - t1)
    first_step_end = first_step_end or time.time()
dt = time.perf_counter() - t0
n = sum(len(b["labels"]) for b in batches)
c = model.config
print("MODEL " + json.dumps({
    "family": c.model_type, "class": type(model).__name__, "layers": c.num_hidden_layers,
    "hidden": c.hidden_size, "heads": c.num_attention_heads,
    "intermediate": getattr(c, "intermediate_size", None), "vocab_size": c.vocab_size,
    "pad_token_id": pad_id, "parameters": sum(p_.numel() for p_ in model.parameters())}))
recipe = {"optimizer": "adamw_torch_fused" if fused else "torch.optim.AdamW",
          "learning_rate": a.learning_rate, "weight_decay": a.weight_decay,
          "max_grad_norm": a.max_grad_norm, "lr_schedule": "linear",
          "warmup_ratio": 0.0, "adam_epsilon": 1e-8,
          "precision": "bf16 autocast" if a.bf16 else "fp32",
          "untimed_warmup_steps": a.warmup, "timed_steps": len(batches),
          "batch_size": len(batches[0]["labels"]), "padding": "per batch, to its longest row"}
print("RESULT " + json.dumps({"examples_per_s": n / dt, "seconds": dt, "steps": len(batches),
                              "examples": n, "final_loss": loss,
                              "step_seconds": step_seconds, "warmup_steps": a.warmup,
                              "first_step_end_unix": first_step_end,
                              "threads": torch.get_num_threads(), "torch": torch.__version__,
                              "fused_adamw": fused, "bf16": bool(a.bf16), "recipe": recipe}))
sys.stdout.flush()
