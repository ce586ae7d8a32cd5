"""Strategy resolution from the topology: the mapping and its errors (no TensorFlow)."""
import json

import pytest

from tasks.errors import ConfigError
from tasks.topology import (Topology, cluster_shape, cluster_task, resolve_strategy_name,
                            worker_position)


@pytest.mark.parametrize("topology, visible, expected", [
    (Topology(), None, "one_device"),
    (Topology(), 1, "one_device"),
    (Topology(), 4, "mirrored"),
    (Topology(devices_per_worker=2), None, "mirrored"),
    (Topology(num_workers=2), None, "multi_worker_mirrored"),
    (Topology(num_workers=2, num_ps=1), None, "parameter_server"),
    (Topology(accelerator="tpu", tpu_address="local"), None, "tpu"),
    (Topology(tpu_address="grpc://10.0.0.2:8470"), None, "tpu"),
])
def test_auto_picks_what_the_topology_offers(topology, visible, expected):
    assert resolve_strategy_name(topology, "auto", visible) == expected


@pytest.mark.parametrize("topology, requested, field", [
    (Topology(num_workers=2), "one_device", "num_workers"),
    (Topology(num_workers=3), "central_storage", "num_workers"),
    (Topology(), "parameter_server", "num_ps"),
    (Topology(num_ps=1), "multi_worker_mirrored", "num_ps"),
    (Topology(accelerator="tpu"), "tpu", "tpu_address"),
    (Topology(accelerator="gpu", tpu_address="local"), "tpu", "accelerator"),
    (Topology(tpu_address="local"), "mirrored", "strategy"),
    (Topology(devices_per_worker=2), "one_device", "devices_per_worker"),
])
def test_conflicts_name_the_field_to_change(topology, requested, field):
    with pytest.raises(ConfigError) as err:
        resolve_strategy_name(topology, requested)
    assert err.value.field == field


def test_cluster_shape_per_strategy():
    t = Topology(num_workers=2, num_ps=1)
    assert cluster_shape("parameter_server", t) == {"chief": 1, "worker": 2, "ps": 1}
    assert cluster_shape("multi_worker_mirrored", Topology(num_workers=3)) == {"worker": 3}
    for single in ("one_device", "mirrored", "central_storage", "tpu"):
        assert cluster_shape(single, Topology()) == {}


def test_cluster_task_reads_role_index_and_the_roles_size():
    cluster = {"chief": ["a:1"], "worker": ["b:1", "c:1", "d:1"], "ps": ["e:1"]}
    config = {"cluster": cluster, "task": {"type": "worker", "index": 2}}
    assert cluster_task({"TF_CONFIG": json.dumps(config)}) == ("worker", 2, 3)
    assert cluster_task({}) == ("chief", 0, 1)


def test_worker_position_counts_the_chief_first():
    """Vertex AI runs worker 0 of a workers-only cluster as "chief" (pool 0): it and the
    workers after it must get distinct positions."""
    def position(role, index, cluster):
        config = {"cluster": cluster, "task": {"type": role, "index": index}}
        return worker_position({"TF_CONFIG": json.dumps(config)})

    vertex = {"chief": ["a:1"], "worker": ["b:1", "c:1"]}
    assert [position("chief", 0, vertex), position("worker", 0, vertex),
            position("worker", 1, vertex)] == [(0, 3), (1, 3), (2, 3)]
    local = {"worker": ["a:1", "b:1"]}
    assert [position("worker", i, local) for i in (0, 1)] == [(0, 2), (1, 2)]
    assert worker_position({}) == (0, 1)
