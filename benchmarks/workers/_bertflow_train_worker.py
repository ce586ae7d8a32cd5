"""bertflow side of train_throughput: the project's real train step, `tasks.steps.train.run`
(strategy, tasks.training.model optimizer/precision, tasks.training.inputs length-grouped TFRecord batches,
Keras fit with the project's callbacks) on the same SST-2 rows as the peer.

Untimed set-up: the rows are written to a TSV and go through `tasks.steps.data.run` and
`tasks.steps.tokenize.run` into a fresh run folder. Then `tasks.steps.train.run` trains for
warmup + timed steps; step end times are read by wrapping `tasks.steps.train.Progress.step_done`
(the project's own per-step hook). The warm-up is one pass over the rows, so the timed steps
are the second pass: the peer's rows exactly, grouped into bertflow's own batches (the peer
worker also warms up on one pass of its batches by default).
`--set field=value` overrides RunConfig fields (e.g. mixed_precision).
Prints one line `RESULT {json}`, with `first_step_end_unix` (wall clock at the end of the
first training step: the driver reports start-up, process start to first step, from it; the
untimed data and tokenize steps fall inside it, `setup_s`) and `recipe` (this side's optimizer,
schedule, clipping, weight decay, precision), after a line `MODEL {json}`: the family and shape
of the model the train step saved, and its parameter count (read from its safetensors
header)."""
import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

p = argparse.ArgumentParser()
p.add_argument("--batches", required=True)
p.add_argument("--model-dir", required=True)
p.add_argument("--warmup", type=int, default=None,
               help="untimed steps; default one pass over the rows, so that the timed steps are "
                    "the next pass: exactly the peer's rows, in bertflow's own batches")
p.add_argument("--set", action="append", default=[])
a = p.parse_args()

from tasks.steps import data as data_step, tokenize as tokenize_step, train as train_step  # noqa
from tasks.config import RunConfig  # noqa: E402
from tasks.runs.runlayout import RunContext, write_run_config  # noqa: E402
from lib.trainbench_data import train_flops  # noqa: E402

batches = json.load(open(a.batches))["batches"]
timed_steps = len(batches)
batch_size = len(batches[0]["labels"])
if a.warmup is None:
    a.warmup = timed_steps
work = Path(tempfile.mkdtemp(prefix="bench-bertflow-train-"))
tsv = work / "rows.tsv"
with open(tsv, "w", encoding="utf-8") as f:
    # The tokenizer is deterministic, so decoding is not needed: write the original rows.
    f.write("text\tlabel\n")
    for b in batches:
        for text, y in zip(b["texts"], b["labels"]):
            f.write(f"{text}\t{y}\n")
overrides = {}
for kv in a.set:
    k, v = kv.split("=", 1)
    try:
        overrides[k] = json.loads(v)
    except json.JSONDecodeError:
        overrides[k] = v
cfg = RunConfig(**{
    "train_uri": str(tsv), "eval_uri": str(tsv), "artifact_root": str(work / "art"),
    "base_model": a.model_dir, "per_replica_batch_size": batch_size, "epochs": 2,
    "max_steps": a.warmup + timed_steps, "checkpoint_every_steps": 10_000,
    # Training only: the eval split here is the training rows (the evaluate step's work).
    "evaluate_in_train": False, **overrides})
ctx = RunContext(str(work / "art"), "bench", "train")
write_run_config(ctx, cfg)
t_setup = time.perf_counter()
data_step.run(cfg, ctx)
tokenize_step.run(cfg, ctx)
setup_s = time.perf_counter() - t_setup

ends: list[tuple[int, float]] = []
first_step_end_unix: list[float] = []
_orig = train_step.Progress.step_done


def step_done(self, step, metrics):
    ends.append((step, time.perf_counter()))
    if not first_step_end_unix:
        first_step_end_unix.append(time.time())
    return _orig(self, step, metrics)


train_step.Progress.step_done = step_done
t0 = time.perf_counter()
manifest_uri = train_step.run(cfg, ctx)
wall = time.perf_counter() - t0
manifest = json.loads(Path(manifest_uri).read_text())
start = dict(ends)[a.warmup]
end = ends[-1][1]
n_steps = ends[-1][0] - a.warmup
dt = end - start
n_ex = n_steps * batch_size
# FLOPs of the batches bertflow really computed: its input pipeline is deterministic for a
# seed, so it is replayed here (untimed) to read the padded shape of every timed batch.
from tasks.training import inputs  # noqa: E402
from tasks.runs.runlayout import read_manifest  # noqa: E402

tok = read_manifest(ctx.manifest_uri("tokenize"))
with inputs.local_shards(tok, "train") as files:
    replay = inputs.train_dataset(files, batch_size, cfg.max_seq_length, cfg.seed,
                                  num_rows=tok["splits"]["train"]["num_examples"])
    timed = list(replay.skip(a.warmup).take(n_steps))
shapes = [f["input_ids"].shape for f, _ in timed]
tokens = sum(b * length for b, length in shapes)
real = sum(int(f["attention_mask"].numpy().sum()) for f, _ in timed)
model_config = json.loads((Path(a.model_dir) / "config.json").read_text())
flops = train_flops(tokens, sum(b for b, _ in shapes),
                    sum(b * length ** 2 for b, length in shapes),
                    layers=model_config["num_hidden_layers"], hidden=model_config["hidden_size"],
                    ffn=model_config["intermediate_size"])
# Each timed step's own time (from the previous step's end), for medians.
step_seconds = [t1 - t0 for (s0, t0), (s1, t1) in zip(ends, ends[1:]) if s0 >= a.warmup]
saved = Path(manifest["model_dir"])
from tasks.model.config import EncoderConfig  # noqa: E402

built = EncoderConfig.from_pretrained(saved)
with open(saved / "model.safetensors", "rb") as f:
    header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
print("MODEL " + json.dumps({
    "family": built.family, "class": "tasks.model.classifier.Classifier",
    "layers": built.num_layers, "hidden": built.hidden_size, "heads": built.num_heads,
    "intermediate": built.intermediate_size, "vocab_size": built.vocab_size,
    "pad_token_id": built.pad_token_id,
    "parameters": sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")}))
recipe = {"optimizer": "tasks.training.model.AdamW (fused; bertflow's CPU kernel where built)",
          "learning_rate": cfg.learning_rate, "weight_decay": cfg.weight_decay,
          "max_grad_norm": manifest.get("max_grad_norm"), "lr_schedule": "linear",
          "warmup_ratio": cfg.warmup_ratio,
          "adam_epsilon": 1e-8, "precision": manifest["mixed_precision"],
          "untimed_warmup_steps": a.warmup, "timed_steps": n_steps,
          "batch_size": batch_size,
          "padding": "per batch, to its longest row (bertflow's own length-grouped batches)"}
print("RESULT " + json.dumps({
    "examples_per_s": n_ex / dt, "seconds": dt, "steps": n_steps, "examples": n_ex,
    "padded_tokens": tokens, "mean_padded_length": tokens / n_ex,
    "padding_fraction": 1 - real / tokens, "real_tokens_per_s": real / dt,
    "warmup_steps": a.warmup, "train_gflop_per_s": flops / dt / 1e9,
    "step_seconds": step_seconds,
    "train_step_wall_s": wall, "manifest_examples_per_second": manifest["examples_per_second"],
    "precision": "bf16" if "bfloat16" in manifest["mixed_precision"] else "fp32",
    "mixed_precision": manifest["mixed_precision"], "strategy": manifest["strategy"],
    "cpu_kernels": manifest["cpu_kernels"],
    "final_loss": manifest["final_loss"], "overrides": overrides,
    "first_step_end_unix": first_step_end_unix[0], "setup_s": setup_s, "recipe": recipe}))
sys.stdout.flush()
import shutil  # noqa: E402
shutil.rmtree(work, ignore_errors=True)
