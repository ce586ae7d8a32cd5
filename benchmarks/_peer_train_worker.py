"""Peer side of train_throughput: HF transformers + PyTorch CPU, AdamW, dynamic padding,
length-grouped batches (given by the driver), optional bfloat16 autocast. Runs in .venv-peer
(no TensorFlow). Prints one line `RESULT {json}`."""
import argparse
import json
import sys
import time

import torch
from transformers import BertForSequenceClassification

p = argparse.ArgumentParser()
p.add_argument("--batches", required=True)
p.add_argument("--model-dir", required=True)
p.add_argument("--bf16", action="store_true")
p.add_argument("--warmup", type=int, default=3)
p.add_argument("--threads", type=int, default=0)
# the Trainer's default optimizer in transformers 4.57 with torch >= 2.8 (adamw_torch_fused)
p.add_argument("--fused", action="store_true", help="torch's fused AdamW, as the Trainer uses")
a = p.parse_args()
if a.threads:
    torch.set_num_threads(a.threads)
torch.manual_seed(0)
data = json.load(open(a.batches))
model = BertForSequenceClassification.from_pretrained(a.model_dir, num_labels=2)
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01, fused=a.fused or None)


def step(b):
    n = max(len(x) for x in b["input_ids"])
    ids = torch.zeros((len(b["input_ids"]), n), dtype=torch.long)
    for i, x in enumerate(b["input_ids"]):
        ids[i, :len(x)] = torch.tensor(x)
    mask = (ids != 0).long()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
        loss = model(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids),
                     labels=torch.tensor(b["labels"])).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss)


batches = data["batches"]
for b in batches[:a.warmup]:
    step(b)
t0 = time.perf_counter()
step_seconds = []
for b in batches:
    t1 = time.perf_counter()
    loss = step(b)
    step_seconds.append(time.perf_counter() - t1)
dt = time.perf_counter() - t0
n = sum(len(b["labels"]) for b in batches)
print("RESULT " + json.dumps({"examples_per_s": n / dt, "seconds": dt, "steps": len(batches),
                              "examples": n, "final_loss": loss,
                              "step_seconds": step_seconds,
                              "threads": torch.get_num_threads(), "torch": torch.__version__,
                              "fused_adamw": bool(a.fused), "bf16": bool(a.bf16)}))
sys.stdout.flush()
