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
