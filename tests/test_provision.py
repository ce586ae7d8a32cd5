"""LocalCluster with real subprocesses (tiny Python scripts; no TensorFlow needed)."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tasks.io import storage
from tasks.config import parse_config
from tasks.errors import WorkerError
from tasks.provision.attempts import WorkerLost
from tasks.provision.local.cluster import LocalCluster, local_tmp_root
from tasks.provision.spec import WorkerSpec
from tasks.provision.local.backend import pid_record_uri
from tasks.steps import release
from tasks.steps.provision import run as provision_run
from tasks.provision.local.cluster import free_ports
from tasks.runs.runlayout import RunContext

PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)

# Every worker script gets this preamble: it records its own pid and, when asked, starts a
# grandchild (to prove the whole process group goes away) and records that pid too.
PREAMBLE = """
import json, os, subprocess, sys, time
role = json.loads(os.environ.get("TF_CONFIG", '{"task": {"type": "worker", "index": 0}}'))["task"]
name = f"{role['type']}-{role['index']}"
pids = os.environ["PID_DIR"]
open(os.path.join(pids, name), "w").write(str(os.getpid()))
if os.environ.get("SPAWN_CHILD"):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(os.path.join(pids, name + "-child"), "w").write(str(child.pid))
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie has already exited


def all_gone(pids: list[int], timeout: float = 5.0) -> bool:
    """SIGKILL is asynchronous: a killed grandchild may take a moment to disappear."""
    deadline = time.monotonic() + timeout
    while any(alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def recorded_pids(pid_dir: Path) -> list[int]:
    return [int(p.read_text()) for p in pid_dir.iterdir()]


@pytest.fixture
def make_spec(tmp_path):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()

    def make(body: str, cluster: dict | None = None, **env) -> WorkerSpec:
        script = tmp_path / "worker.py"
        script.write_text(PREAMBLE + textwrap.dedent(body))
        return WorkerSpec(command=["python", str(script)],
                          env={"PID_DIR": str(pid_dir), **env}, cluster=cluster or {})

    make.pid_dir = pid_dir
    return make


class Lines(list):
    """Thread-safe enough collector for the log callback (list.append is atomic)."""

    def of(self, prefix: str) -> list[str]:
        return [ln[len(prefix) + 1:] for ln in self if ln.startswith(prefix + " ")]


def test_tf_config_per_role_and_prefixed_streaming(make_spec):
    # Parameter-server shape: chief, 2 workers, 1 ps. Workers and ps are servers that never
    # exit on their own; the run ends when the chief succeeds.
    spec = make_spec("""
        print("TF_CONFIG=" + os.environ["TF_CONFIG"], flush=True)
        print("to stderr", file=sys.stderr, flush=True)
        printed = os.path.join(os.path.dirname(pids), "printed")
        os.makedirs(printed, exist_ok=True)
        open(os.path.join(printed, name), "w").close()
        if role["type"] != "chief":
            time.sleep(600)
        while len(os.listdir(printed)) < 4:  # end once every process has spoken
            time.sleep(0.05)
    """, cluster={"chief": 1, "worker": 2, "ps": 1})
    lines = Lines()
    started = time.monotonic()
    LocalCluster(spec, log=lines.append, grace_seconds=2).run()
    assert time.monotonic() - started < 15

    configs = {}
    for prefix in ("[chief:0]", "[worker:0]", "[worker:1]", "[ps:0]"):
        out = lines.of(prefix)
        assert "to stderr" in out
        configs[prefix] = json.loads(next(x for x in out if x.startswith("TF_CONFIG="))[10:])
    cluster = configs["[chief:0]"]["cluster"]
    assert {k: len(v) for k, v in cluster.items()} == {"chief": 1, "worker": 2, "ps": 1}
    addresses = [a for v in cluster.values() for a in v]
    assert len(set(addresses)) == 4 and all(a.startswith("127.0.0.1:") for a in addresses)
    assert all(c["cluster"] == cluster for c in configs.values())
    assert configs["[worker:1]"]["task"] == {"type": "worker", "index": 1}
    assert configs["[ps:0]"]["task"] == {"type": "ps", "index": 0}
    assert all_gone(recorded_pids(make_spec.pid_dir))


def test_single_process_gets_no_tf_config_and_a_scratch_tmpdir(make_spec, tmp_path,
                                                               monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"stale": true}')
    spec = make_spec("""
        print("TF_CONFIG" in os.environ, os.environ["TF_USE_LEGACY_KERAS"],
              os.environ["TMPDIR"], flush=True)
    """)
    lines = Lines()
    LocalCluster(spec, log=lines.append, tmp_root=tmp_path / "scratch").run()
    assert lines.of("[worker:0]") == [f"False 1 {tmp_path / 'scratch' / 'worker-0'}"]


def test_one_failing_worker_stops_all_and_reports_its_error(make_spec):
    spec = make_spec("""
        if role["index"] == 1:
            time.sleep(1)
            print("loading shard 3", flush=True)
            sys.exit("ValueError: shard 3 is corrupt")
        time.sleep(600)
    """, cluster={"worker": 3}, SPAWN_CHILD="1")
    started = time.monotonic()
    with pytest.raises(WorkerError) as err:
        LocalCluster(spec, log=lambda line: None, grace_seconds=2).run()
    assert time.monotonic() - started < 15
    message = str(err.value)
    assert message.startswith("worker:1 exited with code 1: ValueError: shard 3 is corrupt")
    assert "loading shard 3" in message
    pids = recorded_pids(make_spec.pid_dir)
    assert len(pids) == 6  # 3 workers + 3 grandchildren
    assert all_gone(pids)


def test_a_worker_killed_by_a_signal_is_named_though_a_peer_failed_a_moment_sooner(make_spec):
    # worker:0's collective fails first (exit 1); worker:1, the root cause, dies of SIGKILL
    # half a second later. The error names worker:1 and its last lines, then worker:0.
    spec = make_spec("""
        import signal
        if role["index"] == 0:
            time.sleep(1)
            sys.exit("CollectiveOps: peer worker:1 unreachable")
        if role["index"] == 1:
            print("step 4: loss 0.69", flush=True)
            time.sleep(1.5)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(600)
    """, cluster={"worker": 3})
    with pytest.raises(WorkerLost) as err:
        LocalCluster(spec, log=lambda line: None, grace_seconds=2).run()
    message = str(err.value)
    assert message.startswith("worker:1 exited with code -9: step 4: loss 0.69; then worker:0 "
                              "exited with code 1\n--- last output of worker:1 ---\n"), message
    assert "CollectiveOps" not in message.split("---", 1)[1]
    assert all_gone(recorded_pids(make_spec.pid_dir))


def test_the_worker_whose_output_ended_first_is_named_when_none_died_of_a_signal(make_spec):
    # worker:2 exits first with its own error; worker:0 and worker:1 follow with collective
    # errors before the controller's settle window ends. Poll order (worker:0 first) must not
    # decide; SIGABRT (TensorFlow's abort after a failed collective) is no signal death.
    spec = make_spec("""
        import signal
        if role["index"] == 2:
            time.sleep(1)
            sys.exit("ResourceExhaustedError: OOM when allocating tensor")
        time.sleep(1.4)
        if role["index"] == 0:
            import resource
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file
            os.kill(os.getpid(), signal.SIGABRT)
        sys.exit("CollectiveOps: peer worker:2 unreachable")
    """, cluster={"worker": 3})
    cluster = LocalCluster(spec, log=lambda line: None, grace_seconds=2)
    with pytest.raises(WorkerError) as err:
        cluster.run()
    message = str(err.value)
    assert message.startswith("worker:2 exited with code 1: ResourceExhaustedError: OOM"), message
    assert "then worker:0 exited with code -6" in message.split("\n")[0]
    assert "then worker:1 exited with code 1" in message.split("\n")[0]


def test_sigterm_ignoring_worker_is_killed_after_the_grace_period(make_spec):
    spec = make_spec("""
        import signal
        marker = os.path.join(os.path.dirname(pids), "ignoring-sigterm")
        if role["index"] == 0:
            while not os.path.exists(marker):  # fail only once worker 1 ignores SIGTERM
                time.sleep(0.05)
            sys.exit(5)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open(marker, "w").close()
        time.sleep(600)
    """, cluster={"worker": 2})
    started = time.monotonic()
    with pytest.raises(WorkerError, match="worker:0 exited with code 5"):
        LocalCluster(spec, log=lambda line: None, grace_seconds=1).run()
    assert 1 <= time.monotonic() - started < 10
    assert all_gone(recorded_pids(make_spec.pid_dir))


def test_stop_from_another_thread_cleans_up(make_spec):
    spec = make_spec("""
        print("ready", flush=True)
        time.sleep(600)
    """, cluster={"worker": 2}, SPAWN_CHILD="1")
    lines = Lines()
    cluster = LocalCluster(spec, log=lines.append, grace_seconds=2)

    def stop_when_ready():
        while len([ln for ln in lines if ln.endswith("ready")]) < 2:
            time.sleep(0.05)
        cluster.stop()

    stopper = threading.Thread(target=stop_when_ready)
    stopper.start()
    with pytest.raises(WorkerError, match="stopped"):
        cluster.run()
    stopper.join()
    pids = recorded_pids(make_spec.pid_dir)
    assert len(pids) == 4 and all_gone(pids)


def test_sigterm_to_the_controller_stops_workers_via_a_signal_handler(make_spec, tmp_path):
    # How Airflow kills a task: SIGTERM to the task process, whose handler calls on_kill ->
    # LocalCluster.stop() on the same thread that is running the cluster.
    spec = make_spec("""
        print("ready", flush=True)
        time.sleep(600)
    """, cluster={"worker": 2}, SPAWN_CHILD="1")
    controller = tmp_path / "controller.py"
    controller.write_text(textwrap.dedent(f"""
        import json, signal, sys
        from tasks.errors import WorkerError
        from tasks.provision.local.cluster import LocalCluster
        from tasks.provision.spec import WorkerSpec
        cluster = LocalCluster(WorkerSpec.from_dict(json.loads({json.dumps(spec.to_dict())!r})),
                               grace_seconds=2)
        signal.signal(signal.SIGTERM, lambda *_: cluster.stop())
        try:
            cluster.run()
        except WorkerError as err:
            sys.exit(f"controller: {{err}}")
    """))
    proc = subprocess.Popen([sys.executable, str(controller)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": PROJECT_ROOT})
    ready = 0
    while ready < 2:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()  # the controller ended before its workers were ready
        ready += line.endswith("ready\n")
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 1 and "workers stopped before finishing" in stderr
    pids = recorded_pids(make_spec.pid_dir)
    assert len(pids) == 4 and all_gone(pids)


def test_lines_of_concurrent_workers_stay_whole_when_logged_with_print(make_spec, tmp_path):
    # print() writes a line and its newline separately; reader threads calling it at once
    # joined two workers' lines into one (an unbuffered pipe, as under Airflow), and a test
    # waiting for both "ready" lines hung.
    spec = make_spec("""
        for i in range(300):
            print(f"line {i}", flush=True)
    """, cluster={"worker": 4})
    controller = tmp_path / "controller.py"
    controller.write_text(textwrap.dedent(f"""
        import json
        from tasks.provision.local.cluster import LocalCluster
        from tasks.provision.spec import WorkerSpec
        spec = WorkerSpec.from_dict(json.loads({json.dumps(spec.to_dict())!r}))
        LocalCluster(spec, print).run()
    """))
    out = subprocess.run([sys.executable, str(controller)], capture_output=True, text=True,
                         check=True, timeout=120,
                         env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": PROJECT_ROOT})
    lines = out.stdout.splitlines()
    broken = [ln for ln in lines if not re.fullmatch(r"\[worker:\d\] line \d+", ln)]
    assert not broken, broken[:5]
    assert len(lines) == 4 * 300


def test_free_ports_are_distinct_and_bindable():
    ports = free_ports(8)
    assert len(set(ports)) == 8
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_port_taken_by_another_program_is_retried_with_new_ports(make_spec, tmp_path):
    # The first launch fails the way TensorFlow's gRPC server does when its port was grabbed
    # between our pick and its bind; the second launch (new ports) succeeds.
    marker = tmp_path / "first-attempt-done"
    spec = make_spec(f"""
        marker = {str(marker)!r}
        if role["index"] == 0 and not os.path.exists(marker):
            open(marker, "w").close()
            sys.exit("UNKNOWN: Could not start gRPC server: Address already in use")
        print("port", json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"][0], flush=True)
    """, cluster={"worker": 2})
    lines = Lines()
    LocalCluster(spec, log=lines.append, grace_seconds=2).run()
    assert any("retrying with new ports" in ln for ln in lines)
    assert lines.of("[worker:0]")[-1].startswith("port 127.0.0.1:")


def test_provision_writes_specs_and_release_kills_leftovers(artifact_root):
    cfg = parse_config({"num_workers": 2, "artifact_root": artifact_root})
    ctx = RunContext(artifact_root, "bert_finetune", "manual_1", "manual_1")
    manifest = storage.read_json(provision_run(cfg, ctx))
    assert manifest["strategy"] == "multi_worker_mirrored"
    assert manifest["cluster"] == {"worker": 2}
    train = WorkerSpec.from_dict(manifest["workers"]["train"])
    assert train.command == ["python", "-m", "tasks", "train", "--run-dir", ctx.run_uri]
    assert train.env["TF_USE_LEGACY_KERAS"] == "1"

    # A leftover of a controller that died: its own process group, recorded like LocalCluster
    # records pids.
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                start_new_session=True)
    from tasks.provision.local.cluster import process_started
    storage.write_json(pid_record_uri(ctx.run_uri, "train"), {"pids": [
        {"pid": leftover.pid, "role": "worker", "index": 0,
         "started": process_started(leftover.pid)}]})
    scratch = local_tmp_root(ctx.run_uri) / "worker-1"
    scratch.mkdir(parents=True)
    try:
        record = storage.read_json(release.run(cfg, ctx))
        assert leftover.wait(timeout=10) == -signal.SIGKILL
        assert record["killed_pids"] == [leftover.pid]
        assert not local_tmp_root(ctx.run_uri).exists()
    finally:
        leftover.kill()
