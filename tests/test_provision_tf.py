"""A real two-process MultiWorkerMirroredStrategy cluster on loopback, started by LocalCluster."""
from __future__ import annotations

import textwrap

from tasks.provision.local.cluster import LocalCluster
from tasks.provision.spec import WorkerSpec

ALL_REDUCE = """
import json, os
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]

@tf.function
def step():
    ctx = tf.distribute.get_replica_context()
    return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.constant([1.0, 2.0]) * (index + 1))

result = strategy.run(step)
print("replicas", strategy.num_replicas_in_sync, "sum", result.numpy().tolist(), flush=True)
"""


def test_multi_worker_mirrored_all_reduce_over_loopback(tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(textwrap.dedent(ALL_REDUCE))
    spec = WorkerSpec(command=["python", str(script)], cluster={"worker": 2},
                      strategy="multi_worker_mirrored")
    lines = []
    LocalCluster(spec, log=lines.append, grace_seconds=30).run()
    # worker 0 contributes [1, 2], worker 1 [2, 4]: both see the sum.
    for name in ("[worker:0]", "[worker:1]"):
        assert f"{name} replicas 2 sum [3.0, 6.0]" in lines, lines
