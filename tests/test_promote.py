"""Quality gate and champion pointer, on local disk, the GCS emulator and moto's S3 server."""
from __future__ import annotations

import json
import threading

import pytest

from storage_servers import connections, gcs_emulator, root, s3_server  # noqa: F401
from tasks.steps import promote
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


def champion(cfg):
    return storage.read_json(promote.champion_uri(cfg))


def test_gate_promotes_within_tolerance_and_refuses_regressions(root, tmp_path):
    cfg, ctx = exported_run(root, tmp_path, "v1", 0.80)
    first = promote_run(cfg, ctx)
    assert first["promoted"] and "no champion yet" in first["reason"]
    assert champion(cfg)["version"] == "v1" and champion(cfg)["previous"] is None

    cfg, ctx = exported_run(root, tmp_path, "v2", 0.79)  # within gate_max_regression 0.02
    second = promote_run(cfg, ctx)
    assert second["promoted"] and second["champion_before"]["version"] == "v1"
    assert champion(cfg)["version"] == "v2"
    assert champion(cfg)["previous"]["version"] == "v1"

    cfg, ctx = exported_run(root, tmp_path, "v3", 0.70)
    third = promote_run(cfg, ctx)
    assert not third["promoted"] and "regresses by more than" in third["reason"]
    assert third["value"] == 0.70 and third["champion_before"]["version"] == "v2"
    assert champion(cfg)["version"] == "v2"
    assert storage.is_complete(third["version_uri"])  # kept, just not promoted


def test_gate_minimum_and_metric_choice(tmp_path):
    root = str(tmp_path / "store")
    cfg, ctx = exported_run(root, tmp_path, "v1", 0.60, gate_min_value=0.65)
    result = promote_run(cfg, ctx)
    assert not result["promoted"] and "below gate_min_value" in result["reason"]
    assert not storage.exists(promote.champion_uri(cfg))

    cfg, ctx = exported_run(root, tmp_path, "v2", 0.60, gate_metric="macro_f1")
    assert promote_run(cfg, ctx)["value"] == pytest.approx(0.5)
    # The next run gates on accuracy: the champion's accuracy is read from its metrics.json.
    cfg, ctx = exported_run(root, tmp_path, "v3", 0.50)
    result = promote_run(cfg, ctx)
    assert not result["promoted"] and "champion v2 0.6000" in result["reason"]


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

    assert all(r["promoted"] for r in results.values())
    final = champion(runs[0][0])
    loser = {"v1": "v2", "v2": "v1"}[final["version"]]
    assert final["previous"]["version"] == loser  # the first promotion is recorded, not lost
    assert results[f"run-{final['version']}"]["champion_before"]["version"] == loser
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
    return cfg, ctx, before, root


def test_check_decides_without_moving_the_pointer_and_shows_both_sides(tmp_path):
    cfg, ctx, before, root = champion_then_candidate(tmp_path, 0.79, 30)
    result = promote.check(cfg, ctx)
    assert result["passed"] and result["require_approval"] and result["version"] == "v2"
    assert result["metrics"] == {"accuracy": 0.79, "macro_f1": pytest.approx(0.69)}
    assert result["champion"]["version"] == "v1"
    assert result["champion_metrics"] == {"accuracy": 0.80, "macro_f1": pytest.approx(0.70)}
    assert storage.read_bytes(promote.champion_uri(cfg)) == before
    assert runlayout.read_manifest(ctx.manifest_uri("gate")) == result

    subject, body = promote.approval_request(result, "/bertflow/runs/bert_finetune/run-v2")
    assert subject == "Promote m v2? accuracy 0.7900 vs champion v1 0.8000"
    assert "| accuracy | 0.7900 | 0.8000 |" in body and "| macro_f1 | 0.6900 | 0.7000 |" in body
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
    refused = promote.check(cfg, ctx)
    assert not refused["passed"] and "regresses" in refused["reason"]


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
    result = promote.check(*runs[1])
    assert result["metric"] == "f1" and result["passed"]
    assert list(result["metrics"]) == ["f1", "macro_f1", "precision", "recall"]
    _, body = promote.approval_request(result, "/bertflow/runs/bert_finetune/run-v2")
    assert "| f1 | 0.4500 | 0.4000 |" in body and "| recall | 0.4000 | 0.3500 |" in body
    assert "accuracy" not in body
