"""Quality gate and champion pointer, on local disk, the GCS emulator and moto's S3 server.

The gate_eval step's comparisons here come from made-up predictions through the step's own
record (gate_eval.compared); the step itself, on real SavedModels, is tests/test_gate_eval.py."""
from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from storage_servers import connections, gcs_emulator, root, s3_server  # noqa: F401
from tasks.gate import unit_scores
from tasks.steps import gate_eval, promote
from tasks.runs import runlayout
from tasks.io import storage
from tasks.config import parse_config
from tasks.errors import StorageError
from tasks.runs.runlayout import RunContext


def exported_run(root, tmp_path, version, accuracy, **overrides):
    """A run whose export step published `version` (a stand-in folder with metrics.json)."""
    folder = tmp_path / f"build-{version}"
    folder.mkdir()
    (folder / "metrics.json").write_text(json.dumps({"accuracy": accuracy,
                                                     "macro_f1": accuracy - 0.1}))
    version_uri = f"{root}/models/m/{version}"
    storage.publish_dir(folder, version_uri)
    ctx = RunContext(str(tmp_path / "artifacts"), "bert_finetune", f"run-{version}",
                     f"run-{version}")
    runlayout.write_manifest(ctx.step_uri("export"), {
        "version_uri": version_uri, "version": version, "model_name": "m",
        "inputs": ["text"]})
    cfg = parse_config({"artifact_root": ctx.artifact_root, "export_uri": f"{root}/models",
                        "model_name": "m", "aws_conn_id": "bertflow_s3", **overrides})
    return cfg, ctx


def promote_run(cfg, ctx):
    return runlayout.read_manifest(promote.run(cfg, ctx))


def judged(cfg, ctx, candidate_right, champion_right, rows=500, **fields):
    """Write the run's gate_eval manifest as the step does, against the current champion:
    on `rows` test rows of class "a", the candidate right on the rows `candidate_right` (a
    slice) and the champion on `champion_right`."""
    truth = np.zeros(rows, np.int64)
    scored = {}
    for side, right in (("candidate", candidate_right), ("champion", champion_right)):
        predicted = np.ones(rows, np.int64)
        predicted[right] = 0
        scored[side] = unit_scores.classification(truth, predicted, ["a", "b"])
    current = champion(cfg)
    record = {"version_uri": f"{cfg.export_uri}/m/x", "version": "x",
              "champion": promote.without_history(current), "metric": cfg.gate_metric_name,
              "test_sha256": "0" * 64,
              **gate_eval.compared(scored, "classification", cfg.gate_metric_name, 0), **fields}
    runlayout.write_manifest(ctx.step_uri("gate_eval"), record)
    return record


def champion(cfg):
    return storage.read_json(promote.champion_uri(cfg))


def test_gate_promotes_a_candidate_not_shown_worse_on_the_same_rows(root, tmp_path):
    cfg, ctx = exported_run(root, tmp_path, "v1", 0.80)
    first = promote_run(cfg, ctx)
    assert first["promoted"] and "no champion yet" in first["reason"]
    assert champion(cfg)["version"] == "v1" and champion(cfg)["previous"] is None

    # v2's own evaluation says 0.70, below v1's stored 0.80; on the same rows it is better.
    cfg, ctx = exported_run(root, tmp_path, "v2", 0.70)
    judged(cfg, ctx, slice(0, 450), slice(0, 400))
    second = promote_run(cfg, ctx)
    assert second["promoted"] and second["champion_before"]["version"] == "v1"
    assert second["reason"] == ("accuracy 0.9000 vs champion v1 0.8000 on the same 500 rows: "
                                "+0.1000 [+0.0760, +0.1280] (95% paired bootstrap)")
    assert champion(cfg)["version"] == "v2"
    assert champion(cfg)["previous"]["version"] == "v1"

    # v3's own evaluation says 0.95; on the same rows it is worse than v2.
    cfg, ctx = exported_run(root, tmp_path, "v3", 0.95)
    judged(cfg, ctx, slice(0, 400), slice(0, 450))
    third = promote_run(cfg, ctx)
    assert not third["promoted"] and "lower end is below -gate_max_regression" in third["reason"]
    assert third["value"] == 0.95 and third["champion_before"]["version"] == "v2"
    assert champion(cfg)["version"] == "v2"
    assert storage.is_complete(third["version_uri"])  # kept, just not promoted


def test_the_tolerance_applies_to_the_intervals_lower_end(tmp_path):
    root = str(tmp_path / "store")
    promote_run(*exported_run(root, tmp_path, "v1", 0.80))
    # One row worse in 500: the interval is below 0, but not by 0.01.
    for tolerance, promoted in ((0.0, False), (0.01, True)):
        cfg, ctx = exported_run(root, tmp_path, f"v2-{tolerance}", 0.80,
                                gate_max_regression=tolerance)
        record = judged(cfg, ctx, slice(1, 400), slice(0, 400))
        assert -0.01 < record["difference"]["low"] < 0
        assert promote.check(cfg, ctx)["passed"] is promoted


def test_a_champion_the_step_did_not_compare_is_not_replaced(tmp_path):
    root = str(tmp_path / "store")
    promote_run(*exported_run(root, tmp_path, "v1", 0.80))
    cfg, ctx = exported_run(root, tmp_path, "v2", 0.90)
    missing = promote_run(cfg, ctx)  # gate_eval never ran for v2
    assert not missing["promoted"] and "gate_eval did not run" in missing["reason"]
    runlayout.write_manifest(ctx.step_uri("gate_eval"), {  # it ran before v1 was promoted
        "champion": None, "metric": "accuracy", "comparable": False, "reason": "no champion yet"})
    early = promote_run(cfg, ctx)
    assert not early["promoted"] and "gate_eval found no champion" in early["reason"]
    judged(cfg, ctx, slice(0, 450), slice(0, 400))
    other_cfg, other_ctx = exported_run(root, tmp_path, "v3", 0.90)
    judged(other_cfg, other_ctx, slice(0, 450), slice(0, 400))
    assert promote_run(other_cfg, other_ctx)["promoted"]  # v3 replaces v1 meanwhile
    stale = promote_run(cfg, ctx)
    assert not stale["promoted"] and stale["reason"] == (
        "the champion is v3, but gate_eval compared with v1; run the gate_eval step again, "
        "then the gate")
    assert champion(cfg)["version"] == "v3"


def test_a_champion_that_cannot_be_compared_falls_to_the_first_model_rule(tmp_path):
    root = str(tmp_path / "store")
    promote_run(*exported_run(root, tmp_path, "v1", 0.80))
    cfg, ctx = exported_run(root, tmp_path, "v2", 0.60)
    runlayout.write_manifest(ctx.step_uri("gate_eval"), {
        "champion": promote.without_history(champion(cfg)), "metric": "accuracy",
        "comparable": False, "reason": "the champion's labels (3) differ from this run's (2)"})
    result = promote_run(cfg, ctx)
    assert result["promoted"] and result["reason"] == (
        "accuracy 0.6000; champion v1 is not comparable (the champion's labels (3) differ "
        "from this run's (2)): judged by the first-model rule")


def test_gate_minimum(tmp_path):
    root = str(tmp_path / "store")
    cfg, ctx = exported_run(root, tmp_path, "v1", 0.60, gate_min_value=0.65)
    result = promote_run(cfg, ctx)
    assert not result["promoted"] and "below gate_min_value" in result["reason"]
    assert not storage.exists(promote.champion_uri(cfg))
    cfg, ctx = exported_run(root, tmp_path, "v2", 0.60, gate_metric="macro_f1")
    assert promote_run(cfg, ctx)["value"] == pytest.approx(0.5)


def test_retry_after_promotion_changes_nothing(tmp_path):
    cfg, ctx = exported_run(str(tmp_path / "store"), tmp_path, "v1", 0.8)
    promote_run(cfg, ctx)
    before = storage.read_bytes(promote.champion_uri(cfg))
    again = promote_run(cfg, ctx)
    assert again["promoted"] and "already the champion" in again["reason"]
    assert storage.read_bytes(promote.champion_uri(cfg)) == before


def test_incomplete_version_is_not_promoted(tmp_path):
    cfg, ctx = exported_run(str(tmp_path / "store"), tmp_path, "v1", 0.8)
    storage.delete_prefix(f"{tmp_path}/store/models/m/v1/{storage.COMPLETE}")
    with pytest.raises(StorageError, match="not a completely published version"):
        promote.run(cfg, ctx)


def test_concurrent_promotions_lose_nothing(root, tmp_path, monkeypatch):
    runs = [exported_run(root, tmp_path, v, acc) for v, acc in (("v1", 0.80), ("v2", 0.81))]
    # Both runs read the (empty) pointer before either writes: the race the conditional
    # write must resolve. Only the timing is arranged; reads and writes are real.
    barrier, real_read, seen = threading.Barrier(2, timeout=30), storage.read_versioned, set()

    def read_together(uri):
        if threading.get_ident() not in seen:
            seen.add(threading.get_ident())
            barrier.wait()
        return real_read(uri)

    monkeypatch.setattr(storage, "read_versioned", read_together)
    results = {}
    threads = [threading.Thread(target=lambda c=c, x=x: results.update(
        {x.run_id: promote_run(c, x)})) for c, x in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    # The first write wins; the other re-reads the pointer and finds a champion its
    # gate_eval never compared it with, so it is refused, not written over the winner.
    final = champion(runs[0][0])
    loser = {"v1": "v2", "v2": "v1"}[final["version"]]
    assert results[f"run-{final['version']}"]["promoted"]
    lost = results[f"run-{loser}"]
    assert not lost["promoted"] and "gate_eval did not run" in lost["reason"]
    assert lost["champion_before"]["version"] == final["version"]
    assert final["previous"] is None
    assert storage.is_complete(f"{root}/models/m/v1") and storage.is_complete(
        f"{root}/models/m/v2")


# --- with require_approval: check (the gate task), the answer, then run ---------------------

def champion_then_candidate(tmp_path, accuracy, timeout_minutes):
    """v1 (accuracy 0.80) promoted; v2 exported with require_approval. Returns (cfg, ctx) of v2,
    the pointer's bytes and the store."""
    root = str(tmp_path / "store")
    cfg, ctx = exported_run(root, tmp_path, "v1", 0.80)
    promote_run(cfg, ctx)
    before = storage.read_bytes(promote.champion_uri(cfg))
    cfg, ctx = exported_run(root, tmp_path, "v2", accuracy, require_approval=True,
                            approval_timeout_minutes=timeout_minutes)
    judged(cfg, ctx, slice(0, round(accuracy * 500)), slice(0, 400))
    return cfg, ctx, before, root


def test_check_decides_without_moving_the_pointer_and_shows_both_sides(tmp_path):
    cfg, ctx, before, root = champion_then_candidate(tmp_path, 0.9, 30)
    result = promote.check(cfg, ctx)
    assert result["passed"] and result["require_approval"] and result["version"] == "v2"
    # Both models' figures on the same 500 test rows, not each one's own evaluation.
    assert result["metrics"]["accuracy"] == 0.9 and result["champion_metrics"]["accuracy"] == 0.8
    assert result["comparison"]["units"] == 500
    assert result["champion"]["version"] == "v1"
    assert storage.read_bytes(promote.champion_uri(cfg)) == before
    assert runlayout.read_manifest(ctx.manifest_uri("gate")) == result

    subject, body = promote.approval_request(result, "/bertflow/runs/bert_finetune/run-v2")
    difference = result["comparison"]["difference"]
    assert subject == (f"Promote m v2? accuracy 0.9000 vs champion v1 0.8000, +0.1000 "
                       f"[{difference['low']:+.4f}, {difference['high']:+.4f}]")
    assert "| accuracy | 0.9000 | 0.8000 |" in body
    assert "same 500 test rows" in body and "0" * 64 in body
    assert "(/bertflow/runs/bert_finetune/run-v2)" in body and "30 minutes" in body
    assert result["champion_run"] is None and "side by side" not in body  # v1 has no lineage

    # With the champion's lineage, the gate names its run and the body links the comparison.
    storage.write_json(f"{result['champion']['version_uri']}/lineage.json",
                       {"dag_id": "bert_finetune", "run_key": "run-v1"})
    result = promote.check(cfg, ctx)
    assert result["champion_run"] == "bert_finetune/run-v1"
    compare = "/bertflow/compare?run=bert_finetune/run-v2&run=bert_finetune/run-v1"
    _, body = promote.approval_request(result, "/bertflow/runs/bert_finetune/run-v2", compare)
    assert f"[side by side with the champion's run]({compare})" in body

    cfg, ctx = exported_run(root, tmp_path, "v3", 0.50)
    judged(cfg, ctx, slice(0, 250), slice(0, 400))
    refused = promote.check(cfg, ctx)
    assert not refused["passed"] and "lower end is below" in refused["reason"]


@pytest.mark.parametrize("answer, reason", [
    (promote.Approval(False, by="ana", at="2026-01-02T03:04:05+00:00"),
     "rejected by ana at 2026-01-02T03:04:05+00:00"),
    (promote.Approval(False, timed_out=True),
     "no approval within approval_timeout_minutes 5: counted as rejected; the champion stays"),
])
def test_a_rejection_or_timeout_keeps_the_champion_and_says_why(tmp_path, answer, reason):
    cfg, ctx, before, _ = champion_then_candidate(tmp_path, 0.90, 5)
    result = runlayout.read_manifest(promote.run(cfg, ctx, answer))
    assert not result["promoted"] and result["reason"] == reason
    assert result["champion_before"]["version"] == "v1"
    assert result["approval"]["approved"] is False
    assert storage.read_bytes(promote.champion_uri(cfg)) == before


def test_an_approval_promotes_and_is_recorded(tmp_path):
    root = str(tmp_path / "store")
    cfg, ctx = exported_run(root, tmp_path, "v1", 0.80, require_approval=True)
    result = runlayout.read_manifest(promote.run(cfg, ctx, promote.Approval(True, by="ana")))
    assert result["promoted"] and result["reason"] == \
        "accuracy 0.8000; no champion yet; approved by ana"
    assert champion(cfg)["version"] == "v1"


def test_the_approval_tables_the_tasks_own_metrics(tmp_path):
    """An entity model's approval shows entity F1, macro-F1, precision and recall beside the
    champion's, gated on f1 (the task's first gate metric), not accuracy it does not have."""
    root = str(tmp_path / "store")
    runs = []
    for version, f1 in (("v1", 0.40), ("v2", 0.45)):
        folder = tmp_path / f"build-{version}"
        folder.mkdir()
        (folder / "metrics.json").write_text(json.dumps(
            {"task": "token_classification", "f1": f1, "macro_f1": f1 - 0.1,
             "precision": f1 + 0.1, "recall": f1 - 0.05}))
        storage.publish_dir(folder, f"{root}/models/ner/{version}")
        ctx = RunContext(str(tmp_path / "artifacts"), "bert_finetune", f"run-{version}",
                         f"run-{version}")
        runlayout.write_manifest(ctx.step_uri("export"), {
            "version_uri": f"{root}/models/ner/{version}", "version": version,
            "model_name": "ner", "inputs": ["text"]})
        cfg = parse_config({"artifact_root": ctx.artifact_root, "export_uri": f"{root}/models",
                            "model_name": "ner", "task": "token_classification",
                            "require_approval": version == "v2"})
        runs.append((cfg, ctx))
    promote_run(*runs[0])
    # 40 sentences with one person each: v2 finds 30 of them, the champion 20.
    tags = ["B-PER", "O"], ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    truth = [tags[0]] * 40
    scored = {side: unit_scores.entities(truth, [{("PER", 0, 1)} if i < found else set()
                                                 for i in range(40)], tags[1])
              for side, found in (("candidate", 30), ("champion", 20))}
    cfg, ctx = runs[1]
    runlayout.write_manifest(ctx.step_uri("gate_eval"), {
        "champion": promote.without_history(champion(cfg)), "test_sha256": "0" * 64,
        "metric": "f1",
        **gate_eval.compared(scored, "token_classification", "f1", 0)})
    result = promote.check(cfg, ctx)
    assert result["metric"] == "f1" and result["passed"]
    assert list(result["metrics"]) == ["f1", "macro_f1", "precision", "recall"]
    assert result["comparison"]["unit"] == "sentences"
    _, body = promote.approval_request(result, "/bertflow/runs/bert_finetune/run-v2")
    # f1 2*30/(40+30) and 2*20/(40+20); recall 30/40 and 20/40
    assert "| f1 | 0.8571 | 0.6667 |" in body and "| recall | 0.7500 | 0.5000 |" in body
    assert "accuracy" not in body


def _three_class_record(cfg):
    """600 test rows (a 300, b 250, c 50): the champion misses 60 rows of b, the candidate
    gets b right but misses 30 rows of c (predicting a): better overall, worse on c."""
    truth = np.array([0] * 300 + [1] * 250 + [2] * 50)
    champ, cand = truth.copy(), truth.copy()
    champ[300:360] = 0
    cand[550:580] = 0
    scored = {side: unit_scores.classification(truth, predicted, ["a", "b", "c"])
              for side, predicted in (("candidate", cand), ("champion", champ))}
    return {"version_uri": f"{cfg.export_uri}/m/x", "version": "x",
            "champion": promote.without_history(champion(cfg)), "metric": "accuracy",
            "test_sha256": "0" * 64, **gate_eval.compared(scored, "classification",
                                                          "accuracy", 0)}


@pytest.mark.parametrize("settings, promoted", [
    ({}, True),  # no slice check: better overall is enough
    ({"gate_per_class_max_regression": 0.1}, False),
    ({"gate_per_class_max_regression": 0.5}, True),  # c's F1 falls by 0.43
    ({"gate_per_class_max_regression": 0.1, "gate_per_class_min_support": 51}, True),
])
def test_the_slice_check_refuses_a_candidate_worse_on_a_supported_class(tmp_path, settings,
                                                                        promoted):
    root = str(tmp_path / "store")
    promote_run(*exported_run(root, tmp_path, "v1", 0.80))
    cfg, ctx = exported_run(root, tmp_path, "v2", 0.95, **settings)
    runlayout.write_manifest(ctx.step_uri("gate_eval"), _three_class_record(cfg))
    result = promote_run(cfg, ctx)
    assert result["promoted"] is promoted, result["reason"]
    assert result["reason"].startswith("accuracy 0.9500 vs champion v1 0.9000 on the same 600")
    if not promoted:
        assert result["reason"].endswith(
            "but F1 fell by more than gate_per_class_max_regression (0.1) on 1 class(es): "
            "c 0.5714 vs 1.0000 (-0.4286, 50 rows)")
