"""The memory estimate and the check that refuses a run that would not fit, in validate (from
config.json alone) and at the start of train (before the model is built)."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.config import RunConfig
from tasks.errors import ConfigError
from tasks.provision import memory_budget
from tasks.training import memory
from train_helpers import LABELS, ROOT, make_run, tiny_model_dir  # noqa: F401

BASE = memory.BertShape(layers=12, hidden=768, heads=12, intermediate=3072, vocab=30522)
LARGE = memory.BertShape(layers=24, hidden=1024, heads=16, intermediate=4096, vocab=30522)


def bert_base_config(folder: Path) -> Path:
    """A bert-base config.json (all validate reads: no weights needed)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({
        "model_type": "bert", "num_hidden_layers": 12, "hidden_size": 768,
        "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 30522,
        "max_position_embeddings": 512, "type_vocab_size": 2}))
    return folder


def test_parameter_count_is_the_models(tiny_model_dir):
    import tf_keras
    from tasks.training import checkpoint

    tf_keras.mixed_precision.set_global_policy("float32")
    model = checkpoint.load_classifier(tiny_model_dir, LABELS)
    shape = memory.BertShape.from_file(tiny_model_dir / "config.json")
    assert shape.num_parameters(len(LABELS)) == model.count_params()
    assert BASE.num_parameters() == 109_483_778  # bert-base-uncased + a 2-label head
    assert 335_000_000 < LARGE.num_parameters() < 336_000_000


def test_estimate_grows_with_batch_and_sequence_and_with_accumulation():
    def total(shape=BASE, **kw):
        return memory.estimate(shape, **{"per_replica_batch_size": 8, "max_seq_length": 128,
                                         **kw}).total
    batches = [total(per_replica_batch_size=b) for b in (1, 2, 8, 32, 128)]
    seqs = [total(max_seq_length=s) for s in (32, 64, 128, 256, 512)]
    assert batches == sorted(batches) and len(set(batches)) == 5
    assert seqs == sorted(seqs) and len(set(seqs)) == 5
    assert total(shape=LARGE) > total()
    # the custom loop keeps a float32 accumulator per trainable variable
    fit, custom = (memory.estimate(BASE, per_replica_batch_size=8, max_seq_length=128,
                                   training_loop=loop) for loop in ("fit", "custom"))
    assert custom.total - fit.total == custom.accumulators == 4 * BASE.num_parameters()
    # mirrored on two logical CPUs holds two of everything but the runtime
    two = memory.estimate(BASE, per_replica_batch_size=8, max_seq_length=128, replicas=2)
    assert two.total - two.overhead == 2 * (fit.total - fit.overhead)


def test_largest_batch_is_the_last_that_fits():
    budget = 24 * memory.GIB
    best = memory.largest_batch(BASE, budget, max_seq_length=512)
    assert memory.estimate(BASE, per_replica_batch_size=best, max_seq_length=512).total <= budget
    assert memory.estimate(BASE, per_replica_batch_size=best + 1,
                           max_seq_length=512).total > budget
    assert memory.largest_batch(LARGE, 2 * memory.GIB, max_seq_length=128) == 0


def test_worker_memory_from_env_cgroup_and_the_machine(tmp_path):
    v2, v1 = tmp_path / "memory.max", tmp_path / "limit_in_bytes"

    def machine():  # (MemTotal, MemAvailable)
        return 24684084 * 1024, 8_000_000 * 1024

    paths = dict(cgroup_v2=v2, cgroup_v1=v1, machine=machine)
    assert memory.worker_memory({memory.MEMORY_ENV: "123"}, **paths) == (123, memory.MEMORY_ENV)
    with pytest.raises(ConfigError, match=memory.MEMORY_ENV):
        memory.worker_memory({memory.MEMORY_ENV: "16G"}, **paths)
    budget, source = memory.worker_memory({}, **paths)  # no cgroup: what is available
    assert source.startswith("MemAvailable") and budget >= 8_000_000 * 1024
    v2.write_text("max\n")  # cgroup v2 without a limit
    assert memory.worker_memory({}, **paths)[1].startswith("MemAvailable")
    v2.write_text(f"{16 << 30}\n")  # a pod's limit
    assert memory.worker_memory({}, **paths) == (16 << 30, "the cgroup memory limit")
    v2.unlink()
    v1.write_text("9223372036854771712\n")  # cgroup v1's "unlimited"
    assert memory.worker_memory({}, **paths)[1].startswith("MemAvailable")
    v1.write_text(f"{64 << 30}\n")  # above the machine: capped by MemTotal
    assert memory.worker_memory({}, **paths)[0] == 24684084 * 1024
    v1.unlink()
    assert memory.worker_memory({}, cgroup_v2=v2, cgroup_v1=v1, machine=lambda: None) == (
        None, "the machine's memory is unknown")


def test_machine_memory_is_this_machine_s():
    """psutil's figures are /proc/meminfo's MemTotal and MemAvailable on Linux."""
    total, available = memory.machine_memory()
    meminfo = {line.split(":")[0]: int(line.split()[1]) * 1024
               for line in open("/proc/meminfo") if line.split()[1].isdigit()}
    assert total == meminfo["MemTotal"]
    assert abs(available - meminfo["MemAvailable"]) < 256 << 20  # read a moment apart
    assert memory._own_rss() > 10 << 20  # this interpreter and pytest at least


def test_local_cluster_processes_share_the_machine():
    cluster = {"worker": ["127.0.0.1:2000", "127.0.0.1:2001", "127.0.0.1:2002"],
               "ps": ["127.0.0.1:2003"]}
    local = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}})
    assert memory.colocated_trainers(local) == 3
    pods = json.dumps({"cluster": {"worker": ["job-0.svc:2222", "job-1.svc:2222"]},
                       "task": {"type": "worker", "index": 0}})
    assert memory.colocated_trainers(pods) == 1
    assert memory.colocated_trainers("") == 1


def test_validate_refuses_a_batch_that_does_not_fit_and_says_what_to_lower(tmp_path):
    folder = bert_base_config(tmp_path / "bert-base")
    env = {memory.MEMORY_ENV: str(8 * memory.GIB)}
    cfg = RunConfig(base_model=str(folder), max_seq_length=512, per_replica_batch_size=32,
                    mixed_precision="mixed_bfloat16")
    with pytest.raises(ConfigError) as err:
        memory_budget.check_config(cfg, memory.readable_config(cfg), env)
    message = str(err.value)
    assert err.value.field == "per_replica_batch_size"
    for field in ("per_replica_batch_size", "max_seq_length", "grad_accum_steps",
                  "training_loop custom", "num_workers", "worker_memory"):
        assert field in message
    # the batch it proposes fits, and so does the accumulation that keeps the global batch
    best, micro, accum = map(int, re.search(
        r"per_replica_batch_size to (\d+) or less \(to keep the global batch: "
        r"per_replica_batch_size (\d+) with training_loop custom and grad_accum_steps (\d+)",
        message).groups())
    assert 1 <= micro <= best < 32 and micro * accum >= 32
    fits = cfg.model_copy(update={"per_replica_batch_size": best})
    assert memory_budget.check_config(fits, folder / "config.json", env).total <= 8 * memory.GIB
    kept = cfg.model_copy(update={"per_replica_batch_size": micro, "grad_accum_steps": accum,
                                  "training_loop": "custom"})
    assert memory_budget.check_config(kept, folder / "config.json", env).accumulators > 0


def test_validate_without_a_batch_that_fits_asks_for_a_shorter_sequence(tmp_path):
    folder = bert_base_config(tmp_path / "bert-base")
    cfg = RunConfig(base_model=str(folder), max_seq_length=512, per_replica_batch_size=1)
    with pytest.raises(ConfigError, match="even per_replica_batch_size 1 does not fit: lower "
                                          "max_seq_length"):
        memory_budget.check_config(cfg, folder / "config.json", {memory.MEMORY_ENV: str(2 << 30)})


def test_validate_budget_by_backend(tmp_path):
    folder = bert_base_config(tmp_path / "bert-base")
    base = dict(base_model=str(folder), max_seq_length=512, per_replica_batch_size=8,
                artifact_root="gs://bucket/art")
    small = RunConfig(**base, provisioner="kubernetes", worker_memory="4Gi")
    with pytest.raises(ConfigError, match=r"4\.0 GiB \(worker_memory\)"):
        memory_budget.check_config(small, folder / "config.json", {})
    big = RunConfig(**base, provisioner="kubernetes", worker_memory="64Gi")
    assert memory_budget.check_config(big, folder / "config.json", {}) is not None
    with pytest.raises(ConfigError, match="worker_memory"):
        memory_budget.check_config(big.model_copy(update={"worker_memory": "lots"}),
                            folder / "config.json", {})
    # Vertex AI machines and GPU pods: the memory is known on the worker (train checks it)
    assert memory_budget.check_config(RunConfig(**base, provisioner="vertex_ai"),
                               folder / "config.json", {}) is None
    gpu = RunConfig(**base, provisioner="kubernetes", worker_memory="4Gi",
                    accelerator_type="nvidia-l4")
    assert memory_budget.check_config(gpu, folder / "config.json", {}) is None
    # local workers share this machine: two of them get half each
    one = RunConfig(base_model=str(folder), max_seq_length=128, per_replica_batch_size=8)
    env = {memory.MEMORY_ENV: str(int(1.2 * memory.estimate(
        BASE, per_replica_batch_size=8, max_seq_length=128, bfloat16=False).total))}
    assert memory_budget.check_config(one, folder / "config.json", env) is not None
    with pytest.raises(ConfigError, match="shared by 2 training processes"):
        memory_budget.check_config(one.model_copy(update={"num_workers": 2}), folder / "config.json",
                            env)
    # a checkpoint validate cannot read here (remote, or not a folder): no check
    assert memory.readable_config(RunConfig(base_model="gs://bucket/bert")) is None
    assert memory.readable_config(RunConfig(base_model=str(tmp_path / "nowhere"))) is None


def _budget_for_batch(model_dir: Path, batch: int) -> int:
    shape = memory.BertShape.from_file(model_dir / "config.json")
    return int(memory.estimate(shape, per_replica_batch_size=batch, max_seq_length=32,
                               bfloat16=False).total / memory.HEADROOM) + 1


def test_train_refuses_before_building_the_model(tmp_path, tiny_model_dir, monkeypatch):
    from tasks.steps import train
    from tasks.training import checkpoint

    built = []
    monkeypatch.setattr(checkpoint, "load_classifier",
                        lambda *a, **k: built.append(a) or pytest.fail("model built"))
    monkeypatch.setenv(memory.MEMORY_ENV, str(_budget_for_batch(tiny_model_dir, 64)))
    cfg, ctx = make_run(tmp_path, tiny_model_dir, per_replica_batch_size=4096)
    with pytest.raises(ConfigError, match="per_replica_batch_size to (6[0-4]) or less") as err:
        train.run(cfg, ctx)
    assert err.value.field == "per_replica_batch_size" and not built
    assert not Path(ctx.step_uri("train")).exists()  # nothing written, no checkpoint


def test_train_worker_exits_2_with_one_error_line(tmp_path, tiny_model_dir):
    """The real worker command, as a backend starts it: refused with one error line (runs that
    fit train through the same check in tests/test_train.py)."""
    cfg, ctx = make_run(tmp_path, tiny_model_dir, per_replica_batch_size=64, epochs=1,
                        max_steps=1)
    env = {**__import__("os").environ,
           memory.MEMORY_ENV: str(_budget_for_batch(tiny_model_dir, 8))}
    cmd = [sys.executable, "-m", "tasks", "train", "--run-dir", ctx.run_uri]
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("bertflow: error:")]
    assert len(errors) == 1 and "per_replica_batch_size" in errors[0]
    assert "max_seq_length" in errors[0] and not Path(ctx.step_uri("train")).exists()
