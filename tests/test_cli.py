"""`python -m tasks`: init-run flags come from RunConfig; steps read the run folder."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.io import storage
from tasks.config import RunConfig

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tasks", *args], capture_output=True,
                          text=True, cwd=PROJECT_ROOT)


def test_every_config_field_is_an_init_run_flag():
    help_text = cli("init-run", "--help").stdout
    for name in RunConfig.model_fields:
        assert f"--{name}" in help_text


def test_init_run_writes_config_and_context(artifact_root, tmp_path):
    config_file = tmp_path / "cfg.json"
    config_file.write_text(json.dumps({"epochs": 7, "max_seq_length": 256}))
    run_dir = f"{artifact_root}/runs/bert_finetune/manual_1"
    done = cli("init-run", "--run-dir", run_dir, "--dag-id", "bert_finetune",
               "--run-key", "manual_1", "--config", str(config_file),
               "--max_seq_length", "64", "--labels", "neg,pos", "--eval_uri", "")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == run_dir
    cfg = json.loads(storage.read_text(f"{run_dir}/config.json"))
    assert (cfg["epochs"], cfg["max_seq_length"]) == (7, 64)  # flags override the file
    assert cfg["labels"] == ["neg", "pos"] and cfg["eval_uri"] is None
    assert cfg["artifact_root"] == artifact_root
    assert storage.read_json(f"{run_dir}/context.json") == {
        "artifact_root": artifact_root, "dag_id": "bert_finetune", "run_key": "manual_1",
        "run_id": "manual_1", "experiment": "default", "logical_date": "", "run_dir": ""}


def test_step_prints_its_manifest_uri(artifact_root):
    run_dir = f"{artifact_root}/runs/bert_finetune/manual_2"
    assert cli("init-run", "--run-dir", run_dir, "--num_workers", "2").returncode == 0
    done = cli("provision", "--run-dir", run_dir)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{run_dir}/provision/manifest.json"
    assert storage.read_json(done.stdout.strip())["strategy"] == "multi_worker_mirrored"


def test_config_errors_are_one_line_and_exit_2(artifact_root):
    run_dir = f"{artifact_root}/runs/bert_finetune/manual_3"
    done = cli("init-run", "--run-dir", run_dir, "--max_seq_length", "4096")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "bertflow: error: config field 'max_seq_length': Input should be less than or equal "
        "to 512 (got 4096)"]
    done = cli("init-run", "--run-dir", run_dir, "--labels", "[neg, pos")
    assert done.returncode == 2 and "config field 'labels': not a JSON list" in done.stderr
    done = cli("init-run", "--run-dir", run_dir, "--dag-id", "other")
    assert done.returncode == 2 and "config field 'dag-id'" in done.stderr


def test_init_run_takes_any_folder(artifact_root, tmp_path):
    run_dir = tmp_path / "my-experiments" / "try1"
    done = cli("init-run", "--run-dir", str(run_dir), "--max-seq-length", "64",
               "--experiment", "short-seqs")
    assert done.returncode == 0, done.stderr
    context = storage.read_json(f"{run_dir}/context.json")
    assert (context["run_dir"], context["run_key"], context["experiment"]) == (
        str(run_dir), "try1", "short-seqs")
    assert context["artifact_root"] == artifact_root  # the token cache stays shared
    done = cli("provision", "--run-dir", str(run_dir))
    assert done.stdout.strip() == f"{run_dir}/provision/manifest.json", done.stderr


def test_missing_run_folder_is_a_clear_error(tmp_path):
    done = cli("train", "--run-dir", str(tmp_path / "nope"))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert "context.json: no such file" in done.stderr


def test_unexpected_worker_errors_exit_non_zero_with_a_traceback(artifact_root):
    run_dir = Path(artifact_root) / "runs" / "bert_finetune" / "manual_4"
    run_dir.mkdir(parents=True)
    (run_dir / "context.json").write_text("{not json")
    done = cli("provision", "--run-dir", str(run_dir))
    assert done.returncode == 1 and "Traceback" in done.stderr


@pytest.mark.skipif(platform.machine() != "x86_64", reason="oneDNN's default is about x86-64")
@pytest.mark.parametrize("setting, enabled", [(None, True), ("0", False)])
def test_bertflow_processes_use_onednn_on_any_x86_cpu_unless_told_not_to(setting, enabled):
    """TensorFlow turns oneDNN on by itself only on CPUs with avx512_vnni, avx512_bf16 or AMX;
    importing tasks turns it on everywhere (1.9x faster training on AVX2), and a user's
    TF_ENABLE_ONEDNN_OPTS wins."""
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    if setting is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = setting
    done = subprocess.run(
        [sys.executable, "-c", "import tasks\n"
         "from tensorflow.python.util import _pywrap_util_port as port\n"
         "print('oneDNN', port.IsMklEnabled())"],
        capture_output=True, text=True, env=env, cwd=PROJECT_ROOT, check=True)
    assert f"oneDNN {enabled}" in done.stdout, done.stdout + done.stderr[-2000:]
