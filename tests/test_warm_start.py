"""tasks/provision/local/warm_start.py: a step process forked from the warm-start server is the process
a fresh `python -m tasks` would be (exit, output, session, signals, what it computes), and
anything the server cannot serve starts cold.

The blocking step is the data step reading its train file from a FIFO that nobody writes: a
real `python -m tasks` process that waits, without TensorFlow, as long as a test needs.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tasks.provision.local.cluster import LocalCluster
from tasks.provision.spec import WorkerSpec
from tasks.provision.local import warm_start
from tasks.provision.spec import process_env
from tasks.runs.runlayout import read_manifest
from train_helpers import saved_weights, make_run, tiny_model_dir  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent


def step_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "tasks", *args]


def cold(argv: list[str]) -> subprocess.Popen:
    """As LocalCluster starts a process without a server."""
    return subprocess.Popen(argv, env=process_env(os.environ), cwd=ROOT,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True)


def warm(argv: list[str], env: dict | None = None, log=None) -> warm_start.WarmProcess:
    proc = warm_start.spawn(argv, env or process_env(os.environ), ROOT, log)
    assert proc is not None, "the session's warm-start server did not serve"
    return proc


@pytest.fixture
def blocked_run(tmp_path) -> str:
    """A run folder whose data step blocks opening its train file (a FIFO). init-run reads
    the train file (validate's checks), so the FIFO replaces a readable file afterwards."""
    train = tmp_path / "train.tsv"
    train.write_text("text\tlabel\na fine day\tpos\na bad day\tneg\n")
    run_dir = tmp_path / "run"
    subprocess.run(step_argv("init-run", "--run-dir", str(run_dir), "--train-uri", str(train),
                             "--artifact-root", str(tmp_path / "artifacts")),
                   cwd=ROOT, check=True, capture_output=True, timeout=120)
    train.unlink()
    os.mkfifo(train)
    return str(run_dir)


def _leads_its_session(pid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.getpgid(pid) == pid and os.getsid(pid) == pid:
            return True
        time.sleep(0.05)
    return False


def test_a_failing_step_exits_and_prints_as_a_cold_one(tmp_path):
    argv = step_argv("train", "--run-dir", str(tmp_path / "no-such-run"))
    outcomes = {}
    for name, start in (("cold", cold), ("warm", warm)):
        proc = start(argv)
        output = proc.stdout.read()
        outcomes[name] = (proc.wait(timeout=120), output)
    assert outcomes["warm"] == outcomes["cold"]
    code, output = outcomes["warm"]
    assert code == 2 and "no-such-run" in output, outcomes


def test_a_waiting_step_leads_its_session_in_the_checkout_and_dies_of_sigterm(blocked_run):
    argv = step_argv("data", "--run-dir", blocked_run)
    for start in (cold, warm):
        proc = start(argv)
        try:
            assert _leads_its_session(proc.pid), f"{start.__name__}: not a session leader"
            assert Path(f"/proc/{proc.pid}/cwd").resolve() == ROOT
            assert proc.poll() is None  # blocked opening the FIFO
            os.killpg(proc.pid, signal.SIGTERM)
            assert proc.wait(timeout=60) == -signal.SIGTERM, start.__name__
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def test_warm_and_cold_processes_train_the_same_weights(tmp_path, tiny_model_dir,  # noqa: F811
                                                        warm_start_server, monkeypatch):
    weights, losses = {}, {}
    for name in ("cold", "warm"):
        if name == "cold":
            monkeypatch.delenv(warm_start.SOCKET_ENV)
        else:
            monkeypatch.setenv(warm_start.SOCKET_ENV, str(warm_start_server["socket"]))
        cfg, ctx = make_run(tmp_path / name, tiny_model_dir, num_train=32, num_eval=8, epochs=1)
        lines: list[str] = []
        LocalCluster(WorkerSpec(command=["python", "-m", "tasks", "train", "--run-dir",
                                         ctx.run_uri]), log=lines.append).run()
        assert not any("cold start" in line for line in lines), lines
        manifest = read_manifest(ctx.manifest_uri("train"))
        weights[name], losses[name] = saved_weights(Path(manifest["model_dir"])), \
            manifest["final_loss"]
    # The warm side really was forked by the server (its log names the run), the cold not.
    served = warm_start_server["log"].read_text()
    assert f"train --run-dir {tmp_path / 'warm'}" in served
    assert f"train --run-dir {tmp_path / 'cold'}" not in served
    assert losses["warm"] == losses["cold"]
    assert weights["warm"].keys() == weights["cold"].keys()
    for key in weights["cold"]:
        np.testing.assert_array_equal(weights["warm"][key], weights["cold"][key], err_msg=key)


def test_an_import_time_variable_of_its_own_starts_cold_and_says_which(tmp_path):
    logged: list[str] = []
    env = {**process_env(os.environ), "TF_CPP_MIN_LOG_LEVEL": "3"}
    assert warm_start.spawn(step_argv("train", "--run-dir", str(tmp_path)), env, ROOT,
                            logged.append) is None
    assert logged == ["[cluster] cold start (import-time environment differs: "
                      "TF_CPP_MIN_LOG_LEVEL)"]
    # Run-time variables do not matter: TF_CONFIG, TMPDIR, credentials.
    proc = warm(step_argv("train", "--run-dir", str(tmp_path / "none")),
                {**process_env(os.environ), "TF_CONFIG": "{}", "TMPDIR": str(tmp_path)})
    assert proc.wait(timeout=120) == 2


def test_other_commands_and_no_server_start_cold(tmp_path, monkeypatch):
    env = process_env(os.environ)
    assert warm_start.spawn([sys.executable, "-c", "pass"], env, ROOT) is None
    logged: list[str] = []
    monkeypatch.setenv(warm_start.SOCKET_ENV, str(tmp_path / "nobody-serves-here"))
    assert warm_start.spawn(step_argv("train"), env, ROOT, logged.append) is None
    assert logged and logged[0].startswith("[cluster] cold start (") and \
        "nobody-serves-here" in logged[0]


def test_a_process_whose_server_died_ends_as_lost(blocked_run, tmp_path, monkeypatch):
    """The exit status dies with the server: wait() returns -SIGKILL (WorkerLost, which the
    attempts policy may retry) once the orphaned process is gone, never hangs."""
    server = warm_start.start(tmp_path / "socket", log_path=tmp_path / "server.log")
    monkeypatch.setenv(warm_start.SOCKET_ENV, str(tmp_path / "socket"))
    proc = warm(step_argv("data", "--run-dir", blocked_run))
    try:
        assert _leads_its_session(proc.pid)
        server.kill()
        server.wait()
        assert proc.poll() is None  # the process outlives its server
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_an_exit_message_that_came_with_the_pid_is_not_lost():
    """A process that ends at once: spawn() may read its exit message in the same read as the
    pid, and hands the rest over, so poll() answers without waiting on the socket."""
    ours, theirs = socket.socketpair()
    with theirs:
        proc = warm_start.WarmProcess(ours, 12345, None, ["python", "-m", "tasks"],
                                      b'{"exit": 3, "cpu_seconds": 0.5}\n')
        assert proc.poll() == 3 and proc.cpu_seconds == 0.5
        assert proc.wait(timeout=0) == 3


@pytest.mark.parametrize("deep", [False, True])
def test_the_socket_folder_takes_a_bindable_path_whatever_tmpdir(deep, tmp_path, monkeypatch):
    """A $TMPDIR 12 levels below tmp_path is too deep for a Unix socket's 107 bytes: the
    folder then goes in /tmp. A short one (a fresh folder in /tmp) is used as it is."""
    import shutil
    import tempfile

    tmpdir = (Path(tmp_path, *["level-%02d" % i for i in range(12)]) if deep
              else Path(tempfile.mkdtemp(dir="/tmp")))
    tmpdir.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read $TMPDIR
    folder = Path(warm_start.socket_folder())
    try:
        fits = len(os.fsencode(tmpdir / "bertflow-warm-12345678" / warm_start.BIND_NAME)) <= 107
        assert fits != deep  # the two cases are the ones meant
        assert folder.parent == (Path("/tmp") if deep else tmpdir)
        assert list(tmpdir.iterdir()) == ([] if deep else [folder])  # none left behind
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.bind(str(folder / warm_start.BIND_NAME))  # the server's first bind
        assert (folder.stat().st_mode & 0o777) == 0o700  # private, as mkdtemp makes it
    finally:
        shutil.rmtree(folder)
        if not deep:
            shutil.rmtree(tmpdir)


# --- the fresh-load check's server (tasks/fresh_load.py) ----------------------------------

def _serving_server_pid() -> int:
    """The session server's serving companion, once it serves (it imports TensorFlow after
    the steps' server has started)."""
    import psutil

    path = os.environ[warm_start.SOCKET_ENV] + warm_start.SERVING_SUFFIX
    deadline = time.monotonic() + 180
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"no serving server on {path}"
        time.sleep(0.2)
    (pid,) = [p.pid for p in psutil.process_iter(["cmdline"])
              if p.info["cmdline"] and path in p.info["cmdline"]]
    return pid


@pytest.fixture(scope="module")
def tokenizing_saved_model(tmp_path_factory) -> str:
    """A SavedModel whose signature runs a tensorflow-text op on raw strings."""
    import tensorflow as tf
    import tensorflow_text as text

    class Words(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def serve(self, text_in):
            words = text.WhitespaceTokenizer().tokenize(text_in)
            return {"count": tf.cast(words.row_lengths(), tf.float32),
                    "first": words[:, :1].to_tensor(default_value="")[:, 0]}

    path = str(tmp_path_factory.mktemp("words") / "saved_model")
    module = Words()
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    return path


def test_the_fresh_load_check_forked_answers_as_a_new_interpreter(tokenizing_saved_model,
                                                                   monkeypatch):
    """Served warm (a WarmProcess, which kill() ends), the check's interpreter gives what a
    new one gives, tensorflow-text's ops included."""
    from tasks import fresh_load

    _serving_server_pid()
    inputs = {"text_in": ["a b c", "héllo  wörld", ""]}
    with open(os.devnull, "w") as out, open(os.devnull, "w") as err:
        proc = warm_start.start_fresh_load(os.getcwd(), out, err)
        assert isinstance(proc, warm_start.WarmProcess)
        proc.kill()
        assert proc.wait(timeout=60) == -signal.SIGKILL
    warm_out = fresh_load.predict(tokenizing_saved_model, inputs,
                                  warm_start.start_fresh_load)
    monkeypatch.delenv(warm_start.SOCKET_ENV)
    assert warm_out == fresh_load.predict(tokenizing_saved_model, inputs) == {
        "count": [3.0, 2.0, 0.0], "first": ["a", "héllo", ""]}


def test_a_graph_needing_bertflows_kernels_fails_the_forked_check_as_a_new_one(
        tmp_path, monkeypatch):
    """The serving server never loaded bertflow's CPU kernels (the steps' server may): a
    SavedModel whose graph needs one is refused in the fork, as in a user's server."""
    import tensorflow as tf

    from tasks import fresh_load
    from tasks.model import cpu_kernels

    if not cpu_kernels.available():
        pytest.skip("bertflow's CPU kernels are not built (make install builds them)")

    class Gelu(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def serve(self, text_in):
            return {"y": cpu_kernels.ops().bertflow_gelu(
                tf.strings.to_number(text_in, tf.float32))}

    path, module = str(tmp_path / "gelu"), Gelu()
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    pid = _serving_server_pid()
    with open(f"/proc/{pid}/maps") as maps:
        assert "bertflow_cpu_kernels" not in maps.read()
    for warm in (True, False):
        if not warm:
            monkeypatch.delenv(warm_start.SOCKET_ENV)
        with pytest.raises(RuntimeError, match="BertflowGelu"):
            fresh_load.predict(path, {"text_in": ["1.5"]}, warm_start.start_fresh_load)


def test_the_serving_server_runs_only_the_fresh_load_script_and_reports_failures(tmp_path):
    """Another command is refused (started cold); a SavedModel that does not load fails in
    the forked interpreter as in a new one, with its traceback on stderr."""
    from tasks import fresh_load

    _serving_server_pid()
    other = [sys.executable, "-c", "print('not the check')"]
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        assert warm_start.spawn_serving(other, fresh_load.environment(), tmp_path, out,
                                        err) is None
    with pytest.raises(RuntimeError, match="fresh interpreter failed") as failed:
        fresh_load.predict(str(tmp_path / "no-such-model"), {"text_in": ["x"]},
                           warm_start.start_fresh_load)
    assert "no-such-model" in str(failed.value)
