"""The gate_eval step on real exported versions: the candidate and the champion scored
through their SavedModels on the candidate run's test rows (tiny random BERTs, exported by
the real export step)."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from tasks.config import parse_config
from tasks.io import storage
from tasks.io.uris import join_uri
from tasks.runs import runlayout
from tasks.steps import export, gate_eval, promote
from test_export import LABELS, VOCAB, fake_run, write_model

WORDS = VOCAB[5:19]


def held_out_rows(count: int = 60) -> list[dict]:
    rng = random.Random(3)
    return [{"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12))),
             "text_pair": None, "label": rng.randrange(len(LABELS))} for _ in range(count)]


def exported_version(tmp_path, name: str, seed: int, rows: list[dict], labels=LABELS):
    """(cfg, ctx, version URI): a run of the tiny model drawn from `seed`, exported, whose
    data step held out `rows` as its test split."""
    model_dir = write_model(tmp_path / f"model-{name}", labels=labels, seed=seed)
    ctx = fake_run(tmp_path, model_dir, run_id=f"run-{name}")
    data = runlayout.read_manifest(ctx.manifest_uri("data"))
    shard = join_uri(ctx.step_uri("data"), "eval-00000.jsonl")
    storage.write_text(shard, "".join(json.dumps(row) + "\n" for row in rows))
    data.update(labels=labels, splits={"eval": {"shards": [shard], "num_examples": len(rows)}})
    runlayout.write_manifest(ctx.step_uri("data"), data)
    cfg = parse_config({"artifact_root": ctx.artifact_root, "model_name": "tiny"})
    version_uri = runlayout.read_manifest(export.run(cfg, ctx))["version_uri"]
    return cfg, ctx, version_uri


def served_accuracy(version_uri: str, rows: list[dict]) -> float:
    """Accuracy of the version's served labels on `rows`, computed here apart from the step."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    serve = tf.saved_model.load(join_uri(version_uri, "saved_model"))
    out = serve.signatures["serving_default"](text=tf.constant([r["text"] for r in rows]))
    predicted = [x.decode() for x in out["label"].numpy()]
    return float(np.mean([p == LABELS[r["label"]] for p, r in zip(predicted, rows)]))


@pytest.fixture(scope="module")
def champion_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("gate-eval")
    cfg, ctx, version_uri = exported_version(tmp_path, "champion", 0, held_out_rows())
    assert runlayout.read_manifest(promote.run(cfg, ctx))["promoted"]  # the first model
    return tmp_path, version_uri


def test_both_models_are_scored_on_the_candidates_test_rows(champion_run):
    tmp_path, champion_uri = champion_run
    rows = held_out_rows()
    cfg, ctx, candidate_uri = exported_version(tmp_path, "candidate", 1, rows)
    result = runlayout.read_manifest(gate_eval.run(cfg, ctx))
    assert result["comparable"] and result["units"] == 60 and result["unit"] == "rows"
    assert result["champion"]["version_uri"] == champion_uri
    assert result["metrics"]["candidate"]["accuracy"] == pytest.approx(
        served_accuracy(candidate_uri, rows))
    assert result["metrics"]["champion"]["accuracy"] == pytest.approx(
        served_accuracy(champion_uri, rows))
    difference = result["difference"]
    assert difference["metric"] == "accuracy" and difference["units"] == 60
    assert difference["difference"] == pytest.approx(
        result["metrics"]["candidate"]["accuracy"] - result["metrics"]["champion"]["accuracy"])
    assert difference["low"] <= difference["difference"] <= difference["high"]
    assert set(result["per_class"]["champion"]) == set(LABELS)
    # The gate decides from this record.
    decision = promote.check(cfg, ctx)
    assert decision["passed"] is (difference["low"] >= 0)
    assert decision["comparison"] == result


def test_a_candidate_identical_to_the_champion_differs_by_zero_and_passes(champion_run):
    tmp_path, _ = champion_run
    # The champion's own weights, exported again by another run.
    cfg, ctx, _ = exported_version(tmp_path, "same", 0, held_out_rows())
    result = runlayout.read_manifest(gate_eval.run(cfg, ctx))
    difference = result["difference"]
    assert difference["difference"] == 0 and difference["low"] <= 0 <= difference["high"]
    assert promote.check(cfg, ctx)["passed"]  # not worse at the lower end, tolerance 0


def test_a_champion_with_other_labels_is_not_comparable(champion_run):
    tmp_path, _ = champion_run
    labels = ["cold", "warm"]
    rows = held_out_rows()
    cfg, ctx, _ = exported_version(tmp_path, "other-labels", 1, rows, labels=labels)
    result = runlayout.read_manifest(gate_eval.run(cfg, ctx))
    assert not result["comparable"] and "labels" in result["reason"]
    assert "cold" in result["reason"] and "metrics" not in result
    decision = promote.check(cfg, ctx)
    assert decision["passed"] and "first-model rule" in decision["reason"]
