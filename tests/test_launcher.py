"""The worker launcher: TF_CONFIG from a pod's role, its Indexed-Job index and the rendered
cluster; Vertex AI's and the local backend's TF_CONFIG taken as they are."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.provision import launcher
from tasks.errors import BertflowError

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CLUSTER = {"chief": ["bf-1-train-chief-0.bf-1-train:2222"],
           "worker": ["bf-1-train-worker-0.bf-1-train:2223",
                      "bf-1-train-worker-1.bf-1-train:2224"],
           "ps": ["bf-1-train-ps-0.bf-1-train:2225"]}


def test_pod_role_and_index_become_tf_config():
    env = {launcher.ROLE_ENV: "worker", launcher.CLUSTER_ENV: json.dumps(CLUSTER),
           launcher.INDEX_ENV: "1"}
    launcher.apply(env)
    assert json.loads(env["TF_CONFIG"]) == {"cluster": CLUSTER,
                                            "task": {"type": "worker", "index": 1}}


@pytest.mark.parametrize("role, index, message", [
    ("evaluator", "0", "expected one of chief, worker, ps"),
    ("worker", "2", "worker:2 is not in the cluster"),
    ("worker", "x", "unreadable"),
])
def test_bad_pod_environment_is_a_clear_error(role, index, message):
    env = {launcher.ROLE_ENV: role, launcher.CLUSTER_ENV: json.dumps(CLUSTER),
           launcher.INDEX_ENV: index}
    with pytest.raises(BertflowError, match=message):
        launcher.apply(env)


def test_vertex_tf_config_is_kept_and_a_single_task_one_dropped():
    vertex = {"cluster": CLUSTER, "task": {"type": "ps", "index": 0, "trial": ""},
              "environment": "cloud", "job": {"worker_pool_specs": []}}
    env = {"TF_CONFIG": json.dumps(vertex)}
    launcher.apply(env)
    assert json.loads(env["TF_CONFIG"]) == vertex
    # Vertex sets a one-chief TF_CONFIG even for a one-replica job: single-process strategies
    # must not see a cluster.
    env = {"TF_CONFIG": json.dumps({"cluster": {"chief": ["h:2222"]},
                                    "task": {"type": "chief", "index": 0},
                                    "environment": "cloud"})}
    assert launcher.apply(env) is None and "TF_CONFIG" not in env


def test_the_cli_builds_tf_config_before_the_step_runs(tmp_path):
    """`python -m tasks <step>` in a pod: a bad role fails before any step work, exit 2."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PROJECT_ROOT),
           launcher.ROLE_ENV: "worker", launcher.CLUSTER_ENV: json.dumps(CLUSTER),
           launcher.INDEX_ENV: "5"}
    done = subprocess.run([sys.executable, "-m", "tasks", "train", "--run-dir",
                           str(tmp_path / "run")], env=env, capture_output=True, text=True,
                          cwd=PROJECT_ROOT)
    assert done.returncode == 2
    assert done.stderr.strip() == ("bertflow: error: task worker:5 is not in the cluster "
                                   f"{CLUSTER} (JOB_COMPLETION_INDEX out of range)")
