"""Exact resume for a combined training recipe (issue 48): polynomial schedule with power 2,
layer_lr_decay, head_learning_rate, freeze embeddings+1, balanced class weights and label
smoothing, on bertflow's AdamW kernel with global-norm clipping, under Mirrored on 2 logical
CPUs. Every run is a fresh train process (`python tests/test_recipe_resume.py RUN_DIR STEP`),
as a worker is; the run stopped by a real SIGTERM (taken by the train step's own handler)
after step 5, mid-epoch, exits 75 and a fresh process resumes it.

The resumed run ends with the uninterrupted run's weights and Adam slots, bit for bit; each
layer group's learning rate at the resume step, read from the live optimizer, is the
uninterrupted run's; the frozen weights are the checkpoint's; the train manifest and the
model card record the same recipe as the uninterrupted run's.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from train_helpers import LABELS, make_run, saved_weights, write_tiny_model  # first: tasks
from tasks.errors import PREEMPTED_EXIT_CODE  # noqa: E402
from tasks.runs.runlayout import read_manifest, write_manifest  # noqa: E402

STOP_AT = 5  # 128 rows / (2 replicas x 8) = 8 steps an epoch: mid-epoch, between checkpoints
RECIPE = dict(lr_schedule="polynomial", lr_power=2.0, layer_lr_decay=0.7,
              head_learning_rate=3e-2, freeze="embeddings+1", class_weights="balanced",
              label_smoothing=0.1)
SETTINGS = dict(strategy="mirrored", devices_per_worker=2, per_replica_batch_size=8, epochs=2,
                learning_rate=1e-2, warmup_ratio=0.25, weight_decay=0.01,
                checkpoint_every_steps=4, **RECIPE)
COUNTS = {LABELS[0]: 96, LABELS[1]: 32}  # the data step's label statistics: balanced != 1
RATES, STATE = "layer_rates.jsonl", "optimizer_state.npz"  # written by main() below


@pytest.fixture(scope="module")
def three_layers(tmp_path_factory) -> Path:
    """Three layers: with embeddings+1 frozen, blocks 1 and 2 and the head train at three
    different rates."""
    return write_tiny_model(tmp_path_factory.mktemp("tiny-model"), num_hidden_layers=3,
                            hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)


def new_run(root: Path, model_dir: Path):
    cfg, ctx = make_run(root, model_dir, 128, 41, **SETTINGS)
    write_manifest(ctx.step_uri("data"), {
        "task": "classification", "labels": LABELS, "has_pair": False,
        "sources": {"train": {"uri": "train.tsv", "sha256": "0" * 64}},
        "splits": {"train": {"num_examples": sum(COUNTS.values()), "label_counts": COUNTS}}})
    return cfg, ctx


def train_in_fresh_process(ctx, sigterm_at: int = 0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, __file__, ctx.run_uri, str(sigterm_at)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TF_USE_LEGACY_KERAS": "1"})


def check(done: subprocess.CompletedProcess, code: int = 0) -> None:
    assert done.returncode == code, done.stdout[-2000:] + done.stderr[-3000:]


def rate_records(ctx) -> list[dict]:
    return [json.loads(line) for line in (Path(ctx.run_uri) / RATES).read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, three_layers):
    """(uninterrupted, resumed): the reference trains while the other run is stopped."""
    root = tmp_path_factory.mktemp("runs")
    ref, run = new_run(root / "ref", three_layers), new_run(root / "run", three_layers)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault(
        "ref", train_in_fresh_process(ref[1])))
    thread.start()
    try:
        check(train_in_fresh_process(run[1], sigterm_at=STOP_AT), PREEMPTED_EXIT_CODE)
    finally:
        thread.join()
    check(result["ref"])
    record = json.loads((Path(run[1].step_uri("train")) / "preemption" / "chief-0.json")
                        .read_text())
    assert record["step"] == STOP_AT and record["signal"] == "SIGTERM"
    check(train_in_fresh_process(run[1]))  # the next attempt
    return ref, run


def test_the_resumed_recipe_ends_with_the_uninterrupted_weights_and_slots(runs, three_layers):
    (_, ref), (_, run) = runs
    manifests = [read_manifest(ctx.manifest_uri("train")) for ctx in (ref, run)]
    for manifest in manifests:
        assert (manifest["strategy"], manifest["num_replicas"]) == ("mirrored", 2)
        assert manifest["cpu_kernels"] is True and manifest["max_grad_norm"] > 0
        assert manifest["steps"] == manifest["total_steps"] == 16
    assert [m["resumed_from_step"] for m in manifests] == [0, STOP_AT]

    base = saved_weights(three_layers)
    a, b = (saved_weights(Path(m["model_dir"])) for m in manifests)
    assert a.keys() == b.keys() == base.keys()
    for key in a:
        np.testing.assert_array_equal(b[key], a[key], err_msg=key)
    frozen = [k for k in base if "embeddings" in k or ".layer.0." in k]
    trained = [k for k in base if k not in frozen]
    assert frozen and all(np.array_equal(b[k], base[k]) for k in frozen)
    assert all(not np.array_equal(b[k], base[k]) for k in trained if ".layer." in k)
    assert max(float(np.abs(b[k] - base[k]).max()) for k in trained) > 1e-2

    # Adam's m and v of every trained variable, and the step counter (main() below): frozen
    # variables have none, in either run.
    slots = [dict(np.load(Path(ctx.run_uri) / STATE)) for ctx in (ref, run)]
    assert slots[0].keys() == slots[1].keys() and "iterations" in slots[0]
    assert not [k for k in slots[0] if "/embeddings/" in k or "/block_0/" in k]
    assert len([k for k in slots[0] if k.endswith("/v")]) == len(trained)
    assert int(slots[1]["iterations"]) == 16
    for key in slots[0]:
        np.testing.assert_array_equal(slots[1][key], slots[0][key], err_msg=key)


def test_each_layer_group_resumes_at_its_rate(runs):
    (_, ref), (_, run) = runs
    reference = {r["iterations"]: r["rates"] for r in rate_records(ref)}
    resumed = rate_records(run)
    # The stopped process recorded steps 0 to 5; the resumed one starts at step 5.
    assert [r["iterations"] for r in resumed] == (list(range(STOP_AT + 1)) +
                                                  list(range(STOP_AT, 17)))
    start = resumed[STOP_AT + 1]
    assert start["at_start"] and start["iterations"] == STOP_AT
    rates = start["rates"]
    assert set(rates) == {"block_1", "block_2", "pooler", "head"}
    # The groups' rates differ as the recipe says (block 1: decay x block 2's; head: 3x).
    assert rates["block_1"] == pytest.approx(0.7 * rates["block_2"], rel=1e-6)
    assert rates["head"] == pytest.approx(3 * rates["block_2"], rel=1e-6)
    assert rates["pooler"] == rates["block_2"] > 0
    for record in resumed:
        assert record["rates"] == reference[record["iterations"]], record


def test_manifest_and_model_card_record_the_recipe_after_a_resume(runs):
    from tasks.steps import export

    (ref_cfg, ref), (cfg, run) = runs
    a, b = (read_manifest(ctx.manifest_uri("train")) for ctx in (ref, run))
    recipe = ("lr_schedule", "lr_power", "warmup_steps", "learning_rate", "label_smoothing",
              "class_weights", "freeze", "layer_lr_decay", "head_learning_rate")
    assert {k: b[k] for k in recipe} == {k: a[k] for k in recipe}
    assert b["class_weights"] == pytest.approx([128 / (2 * 96), 128 / (2 * 32)])
    assert (b["lr_schedule"], b["lr_power"], b["label_smoothing"]) == ("polynomial", 2.0, 0.1)
    assert b["freeze"]["setting"] == "embeddings+1" and b["freeze"]["frozen_weights"] > 0
    assert (b["layer_lr_decay"], b["head_learning_rate"]) == (0.7, 3e-2)

    def training_section(cfg, ctx, train):
        data = read_manifest(ctx.manifest_uri("data"))
        tokens = read_manifest(ctx.manifest_uri("tokenize"))
        card = export.model_card(cfg, ctx, "v1", data, tokens, train, {"num_examples": 41})
        lines = card.split("## Training")[1].split("## Evaluation")[0].splitlines()
        # What the two runs rightly differ in: the time it took and the loss of the last
        # epoch (a resumed run averages that epoch's steps after the resume only).
        return [ln for ln in lines if not ln.startswith(("- goodput", "- final loss"))]

    card = training_section(cfg, run, b)
    assert card == training_section(ref_cfg, ref, a)
    for line in ("- learning-rate schedule: polynomial (power 2.0), 4 warm-up steps",
                 "- label smoothing: 0.1", "- frozen: embeddings+1",
                 "- layer-wise learning rates: x0.7 per layer down from the top; head 0.03",
                 f"- class weights: {{'neg': {128 / 192}, 'pos': 2.0}}"):
        assert line in card, card


# --- the train process ----------------------------------------------------------------------
_GROUP = re.compile(r"/(block_\d+|pooler|head|embeddings)/")


def layer_rates(optimizer, variables) -> dict[str, float]:
    """Each layer group's learning rate for the optimizer's next update, as AdamW applies it
    to that group's variables (its schedule at `iterations` times the variable's factor)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    state = inner._prepare(variables)
    rates: dict[str, set] = {}
    for var in variables:
        group = _GROUP.search(var.name).group(1)
        rate = float(inner._coefficients(var, inner._scaled(var, state))["lr_t"])
        rates.setdefault(group, set()).add(rate)
    assert all(len(values) == 1 for values in rates.values()), rates
    return {group: values.pop() for group, values in rates.items()}


def main(run_dir: str, sigterm_at: int) -> None:
    """train.run, recording each layer group's rate at the start and after every step, and
    at the end the optimizer's slots; with `sigterm_at`, the process sends itself SIGTERM
    once that step is done (train.run's handler saves it and exits 75)."""
    from tasks.runs.runlayout import RunContext, read_run_config
    from tasks.steps import train
    from tasks.training import checkpoint
    from tasks.training import model as model_lib

    cfg = read_run_config(f"{run_dir}/config.json")
    ctx = RunContext(**json.loads(Path(run_dir, "context.json").read_text()))
    made: dict = {}

    def keep(name, make):
        def wrapped(*args, **kwargs):
            made[name] = make(*args, **kwargs)
            return made[name]
        return wrapped

    model_lib.create_optimizer = keep("optimizer", model_lib.create_optimizer)
    checkpoint.load_classifier = keep("model", checkpoint.load_classifier)

    def record(at_start: bool) -> None:
        optimizer, variables = made["optimizer"], made["model"].trainable_variables
        line = {"iterations": int(optimizer.iterations.numpy()), "at_start": at_start,
                "rates": layer_rates(optimizer, variables)}
        with open(Path(run_dir, RATES), "a") as out:
            out.write(json.dumps(line) + "\n")

    progress_init, step_done = train.Progress.__init__, train.Progress.step_done

    def started(self, *args, **kwargs):  # after the checkpoint is restored
        progress_init(self, *args, **kwargs)
        record(True)

    def stepped(self, at, metrics):
        step_done(self, at, metrics)
        record(False)
        if at == sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)

    train.Progress.__init__, train.Progress.step_done = started, stepped
    train.run(cfg, ctx)
    optimizer = getattr(made["optimizer"], "inner_optimizer", made["optimizer"])
    state = {"iterations": optimizer.iterations.numpy()}
    for var in made["model"].trainable_variables:
        for slot in ("m", "v"):
            state[f"{var.name}/{slot}"] = optimizer.get_slot(var, slot).numpy()
    np.savez(Path(run_dir, STATE), **state)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
