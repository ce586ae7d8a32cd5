"""The provisioning seam: the `provisioner` Param picks a backend, remote backends refuse
local run folders on a real run and warn on a dry run, and the local dry run shows its
processes. Each remote backend's own tests are in tests/test_<backend>*.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.config import parse_config
from tasks.errors import ConfigError
from tasks.provision import backends
from tasks.runs.runlayout import RunContext, init_run

from test_cli import cli


@pytest.mark.parametrize("name", sorted(backends.BACKENDS))
def test_every_provisioner_value_has_a_backend(name):
    cfg = parse_config({"provisioner": name, "accelerator": "tpu" if name == "tpu_vm" else "auto",
                        "tpu_address": "local" if name == "tpu_vm" else ""})
    backend = backends.backend_for(cfg)
    assert isinstance(backend, backends.Backend) and backend.name == name


def test_remote_backends_need_bucket_locations():
    cfg = parse_config({"provisioner": "kubernetes", "artifact_root": "/srv/artifacts",
                        "export_uri": "s3://models/prod"})
    with pytest.raises(ConfigError, match="'artifact_root': /srv/artifacts is a local path"):
        backends.check_remote(cfg, dry_run=False)
    warnings = backends.check_remote(cfg, dry_run=True)
    assert len(warnings) == 1 and "a real run refuses this" in warnings[0]
    ok = parse_config({"provisioner": "kubernetes", "artifact_root": "gs://b/root"})
    assert backends.check_remote(ok, dry_run=False) == []


def test_local_dry_run_lists_every_worker_step(artifact_root):
    run_dir = f"{artifact_root}/runs/bert_finetune/manual_dry"
    assert cli("init-run", "--run-dir", run_dir, "--num-workers", "2").returncode == 0
    done = cli("provision", "--dry-run", "--run-dir", run_dir)
    assert done.returncode == 0, done.stderr
    processes = json.loads(done.stdout)
    steps = [p["command"][3] for p in processes]
    assert steps == ["data", "tokenize", "train", "train", "evaluate", "evaluate", "export"]
    assert [p["process"] for p in processes if p["command"][3] == "train"] == [
        "worker:0", "worker:1"]
    # A dry run writes nothing: no provision manifest appears.
    assert cli("provision", "--dry-run", "--run-dir", run_dir).returncode == 0
    assert not (Path(run_dir) / "provision").exists()


def test_release_records_the_backend(artifact_root):
    ctx = RunContext(artifact_root, "bert_finetune", "manual_rel", "manual_rel")
    cfg = parse_config({"artifact_root": artifact_root})
    init_run(cfg, ctx)
    from tasks.steps import release
    from tasks.io import storage

    manifest = storage.read_json(release.run(cfg, ctx))
    assert manifest["backend"] == "local" and manifest["killed_pids"] == []


# --- the command line validates as the DAG's validate task does (tasks/steps/validate.py) --
def _t5(folder: Path) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "t5", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 2, "intermediate_size": 128, "vocab_size": 100,
        "max_position_embeddings": 130}))
    for name in ("vocab.txt", "model.safetensors"):
        (folder / name).write_text("")
    return folder


def test_init_run_refuses_an_unsupported_checkpoint_in_one_line_before_any_step(artifact_root,
                                                                                tmp_path):
    run_dir = f"{artifact_root}/runs/bert_finetune/manual_t5"
    done = cli("init-run", "--run-dir", run_dir, "--base-model",
               str(_t5(tmp_path / "t5")))
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("bertflow: error: config field 'base_model': ")
    assert "model_type 't5'" in line and "Traceback" not in done.stderr
    assert not Path(run_dir, "config.json").exists()  # nothing to run a step on


def test_init_run_refuses_missing_inputs_and_what_capacity_cannot_do(artifact_root, tmp_path):
    run_dir = f"{artifact_root}/runs/bert_finetune/manual_inputs"
    done = cli("init-run", "--run-dir", run_dir, "--train-uri", str(tmp_path / "nope.tsv"))
    assert done.returncode == 2 and done.stderr == (
        f"bertflow: error: {tmp_path / 'nope.tsv'}: file not found (check train_uri / eval_uri)\n")
    done = cli("init-run", "--run-dir", run_dir, "--provisioner", "vertex_ai",
               "--accelerator", "gpu", "--accelerator-type", "NVIDIA_TESLA_T4",
               "--capacity", "flex_start", "--gcp-region", "us-central1")
    assert done.returncode == 2
    assert "config field 'accelerator_type': flex_start (Dynamic Workload Scheduler) does " \
           "not serve NVIDIA_TESLA_T4" in done.stderr


def test_validate_adds_the_backends_checks_to_an_existing_run_folder(artifact_root):
    run_dir = f"{artifact_root}/runs/bert_finetune/manual_validate"
    assert cli("init-run", "--run-dir", run_dir, "--provisioner", "kubernetes").returncode == 0
    done = cli("validate", "--run-dir", run_dir)  # a local run folder: pods cannot see it
    assert done.returncode == 2
    assert done.stderr.startswith("bertflow: error: config field 'artifact_root': ")
    local = f"{artifact_root}/runs/bert_finetune/manual_validate_local"
    assert cli("init-run", "--run-dir", local).returncode == 0
    done = cli("validate", "--run-dir", local)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("inputs, checkpoint and local backend check out")


def test_the_dag_and_the_command_line_share_one_validate():
    """bertflow_airflow/run_tasks.py's checked_run calls tasks/steps/validate.py, not
    checks of its own."""
    import ast

    from tasks.config import PROJECT_ROOT

    source = (PROJECT_ROOT / "bertflow_airflow" / "run_tasks.py").read_text()
    [func] = [n for n in ast.walk(ast.parse(source))
              if isinstance(n, ast.FunctionDef) and n.name == "checked_run"]
    calls = {ast.unparse(n.func) for n in ast.walk(func) if isinstance(n, ast.Call)}
    assert {"validate.check_inputs_and_model", "validate.check_backend"} <= calls
    assert not {c for c in calls if c.startswith(("data.", "checkpoint_sources.",
                                                  "memory_budget.", "backend_for"))}
