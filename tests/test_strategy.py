"""Building real strategies (the topology mapping itself: tests/test_topology.py)."""
import json

import pytest

from tasks.config import RunConfig
from tasks.errors import BertflowError


def test_roles_from_tf_config(monkeypatch):
    from tasks.training import strategy

    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert strategy.task_role() == ("chief", 0) and strategy.is_chief()
    mwms = {"cluster": {"worker": ["localhost:1", "localhost:2"]}}
    for index, chief in ((0, True), (1, False)):
        monkeypatch.setenv("TF_CONFIG", json.dumps({**mwms, "task": {"type": "worker",
                                                                     "index": index}}))
        assert strategy.is_chief() is chief
    ps = {"cluster": {"chief": ["a:1"], "worker": ["a:2"], "ps": ["a:3"]}}
    monkeypatch.setenv("TF_CONFIG", json.dumps({**ps, "task": {"type": "worker", "index": 0}}))
    assert not strategy.is_chief()
    assert strategy.is_server_task("parameter_server")
    assert not strategy.is_server_task("multi_worker_mirrored")


def test_one_device_on_cpu():
    from tasks.training import strategy

    built, name = strategy.build_strategy(RunConfig(accelerator="cpu"))
    assert name == "one_device" and built.num_replicas_in_sync == 1
    assert strategy.device_kind(RunConfig(), name) == "cpu"


def test_multi_worker_without_tf_config_says_what_is_missing(monkeypatch):
    from tasks.training import strategy

    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(BertflowError, match="needs TF_CONFIG"):
        strategy.build_strategy(RunConfig(num_workers=2))


def test_gpu_requested_without_gpu():
    from tasks.training import strategy

    with pytest.raises(BertflowError, match="sees no GPU"):
        strategy.build_strategy(RunConfig(accelerator="gpu"))


def test_unreachable_tpu_names_the_param():
    from tasks.training import strategy

    with pytest.raises(BertflowError, match="cannot reach TPU 'local'.*tpu_address Param"):
        strategy.build_strategy(RunConfig(accelerator="tpu", tpu_address="local"))


def test_logical_cpus_after_tensorflow_started_is_a_clear_error():
    import tensorflow as tf

    from tasks.training import strategy

    tf.constant(1) + 1  # starts the runtime; the CPU can no longer be split
    with pytest.raises(BertflowError, match="before TensorFlow runs anything"):
        strategy.build_strategy(RunConfig(devices_per_worker=2))
