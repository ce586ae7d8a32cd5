"""The DAG's validate task refuses a bad base_model before any compute, with the message of
tasks/training/checkpoint_sources.py (every bad value is covered there, through the same
`check`; here the wiring: real dag.test() in a fresh process, local files)."""
from __future__ import annotations

import json

from dag_child import TINY, run_dags
from train_helpers import write_tiny_model


def test_validate_fails_on_another_architecture_and_makes_no_run_folder(airflow_db, tmp_path):
    model = write_tiny_model(tmp_path / "t5")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_type": "t5"}))
    conf = {**TINY, "artifact_root": str(tmp_path / "artifacts"), "base_model": str(model)}
    log, _ = run_dags({"t5": conf}, timeout=900)
    assert "config field 'base_model'" in log and "model_type 't5'" in log, log[-4000:]
    assert "supported: bert, distilbert, electra, roberta" in log
    assert not (tmp_path / "artifacts" / "runs").exists()  # refused before init_run
