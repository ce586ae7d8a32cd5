"""Run folders: keyed by logical date for scheduled/backfill runs, by run id for manual ones."""
from tasks.config import parse_config
from tasks.runs.runlayout import (RunContext, cache_uri, read_manifest, read_run_config,
                             run_key_for, write_manifest, write_run_config)


def test_run_key_uses_experiment_and_logical_date_for_scheduled_and_backfill_runs():
    date = "2026-11-01T00:00:00+00:00"
    assert run_key_for("scheduled", date, "scheduled__x") == \
        "default__2026-11-01T00_00_00_00_00"
    assert run_key_for("backfill", date, "backfill__y") == run_key_for("scheduled", date, "z")
    assert run_key_for("backfill", date, "backfill__y", "lr3e-5") == \
        "lr3e-5__2026-11-01T00_00_00_00_00"
    assert run_key_for("manual", date, "manual__2026-11-30T10:00:00") == \
        "manual__2026-11-30T10_00_00"


def test_layout_and_manifest_round_trip(tmp_path):
    ctx = RunContext(str(tmp_path), "bert_finetune", "k1", "run-1")
    assert ctx.step_uri("train") == f"{tmp_path}/runs/bert_finetune/k1/train"
    uri = write_manifest(ctx.step_uri("train"), {"steps": 3})
    assert uri == ctx.manifest_uri("train")
    assert read_manifest(uri) == {"steps": 3}
    assert cache_uri("gs://b/root", "abc") == "gs://b/root/cache/tfrecords/abc"


def test_run_config_round_trip(tmp_path):
    ctx = RunContext(str(tmp_path), "d", "k")
    cfg = parse_config({"epochs": 7, "labels": ["a", "b"]})
    assert read_run_config(write_run_config(ctx, cfg)) == cfg
