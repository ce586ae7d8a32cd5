"""Warm start for local step processes: a server that has imported TensorFlow, bertflow's model,
the steps and transformers' tokenizers once, and forks a `python -m tasks <step>` process per
request.

Why: every local step process spent seconds of CPU importing the same modules before it
did any work (benchmarks/results/import_time.json, `modules["tasks.steps.train"]`); a run starts
5-7 of
them, a test session ~130. A fork of an interpreter that has them imported starts in
milliseconds and shares their memory pages.

    python -m tasks.provision.local.warm_start --socket PATH    # serve until SIGTERM
    BERTFLOW_WARM_SOCKET=PATH                             # where LocalCluster asks

`make demo` and `make airflow` start one for their lifetime (bertflow_airflow/demo.py).
Without the variable, or when the server is absent, busy with an incompatible environment,
or asked for another command, LocalCluster starts a fresh interpreter as before: a warm
start is only ever a faster path to the same process.

The forked process is the process a fresh `python -m tasks` would be, as far as a step can
tell: its own session (process group), the requested argv, environment, cwd and stdout
(passed as a file descriptor), default signal handlers, fresh random seeds, and the same
ending (exit code, atexit, a traceback on stderr). The server serves only requests whose
import-time environment (IMPORT_ENV: TF_*, PYTHON*, LD_*, CUDA ...; all read when TensorFlow
loads) equals its own, and refuses to start if the preload started TensorFlow's runtime:
forking is safe before the runtime's thread pools exist, never after. The one thread the
preload leaves is OpenBLAS's (numpy's), which re-creates its pool after a fork. One visible
difference: what importing prints (absl's "All log messages before absl::InitializeLog()",
oneDNN's notice) is in the server's log once, not in each step's output.

Not multiprocessing's forkserver: it serves only the process that started it, and here the
controllers are many processes (each Airflow task runs its own LocalCluster) sharing one
server found through an environment variable.

A second, clean server serves the export's fresh-load check (tasks/fresh_load.py): started by
the steps' server as a new interpreter (`--serving`, on SOCKET + SERVING_SUFFIX) that imports
only tensorflow and tensorflow_text, never bertflow's model or its CPU kernels, so a fork of it
loads a SavedModel as a user's server would, without the ~6 s of CPU that importing
TensorFlow costs a new interpreter (each export starts one; a test session ~130).

Protocol (a Unix socket, one connection per process): the client sends the child's stdout
descriptor (SCM_RIGHTS; the serving server takes stdin, stdout and stderr) and one JSON line
{argv, env, cwd}; the server answers JSON lines: {"pid": N} then {"exit": code} (Popen's
returncode: -N for signal N), or {"cold": reason}.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

SOCKET_ENV = "BERTFLOW_WARM_SOCKET"
# Read when TensorFlow, its plug-ins or Python itself start: a child with other values must
# start cold. TF_CONFIG is read when a strategy is made, at run time.
IMPORT_ENV = ("PYTHON", "TF_", "TPU_", "LD_", "CUDA", "NVIDIA", "XLA_", "OMP_", "MKL",
              "OPENBLAS", "KERAS", "TRANSFORMERS", "HF_", "TOKENIZERS")
RUNTIME_ENV = frozenset({"TF_CONFIG"})
# Not tasks.__main__ itself: runpy warns when the module it runs as __main__ is imported.
# transformers' BERT tokenizer: every export writes the Hugging Face tokenizer files with
# transformers' classes (export.write_hf_checkpoint), and importing transformers is most of
# that (it scans its whole package for its lazy names); the other families' tokenizer
# classes are then cheap attribute lookups. It starts no thread and no TensorFlow.
PRELOAD = ("tensorflow", "tensorflow_text", "tasks.model.classifier",
           "tasks.provision.launcher", "tasks.runs.runlayout", "tasks.steps.data",
           "tasks.steps.tokenize", "tasks.steps.train", "tasks.steps.evaluate",
           "tasks.steps.export", "tasks.steps.gate_eval",
           "transformers.models.bert.tokenization_bert")
# The serving server's preload: what tasks/fresh_load.py's interpreter imports, and no more.
SERVING_PRELOAD = ("tensorflow", "tensorflow_text")
SERVING_SUFFIX = ".serving"


def import_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_ENV) and k not in RUNTIME_ENV}


def is_step_command(argv: list[str]) -> bool:
    return len(argv) >= 3 and argv[1:3] == ["-m", "tasks"]


# --- client ------------------------------------------------------------------------------
class WarmProcess:
    """The part of subprocess.Popen that LocalCluster uses, for a process the server forked
    (not this process's child: its exit status arrives over the socket)."""

    def __init__(self, sock: socket.socket, pid: int, stdout, args: list[str],
                 received: bytes = b"", stdin=None):
        self._sock, self.pid, self.stdout, self.args = sock, pid, stdout, args
        self.stdin = stdin
        self._buffer = received
        self._orphaned = False
        self.returncode: int | None = None
        self.cpu_seconds: float | None = None  # user+system, once it exited

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._read(left if left is not None else 1.0)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def _read(self, timeout: float) -> None:
        """Take the exit message if it came within `timeout`. LocalCluster.stop() may call
        this from another thread or a signal handler meanwhile: whoever closes the socket has
        set returncode, and the other call returns."""
        if self._take_exit() or self.returncode is not None:
            return
        if self._orphaned:
            if _alive(self.pid):
                time.sleep(min(timeout, 0.1))
            else:
                self.returncode = -signal.SIGKILL
            return
        try:
            ready, _, _ = select.select([self._sock], [], [], timeout)
            chunk = self._sock.recv(4096) if ready else None
        except (OSError, ValueError):  # closed by the other caller
            return
        if chunk == b"":
            # The server died before the process ended, and the exit status with it: once the
            # process is gone it counts as lost (killed), which the caller may retry.
            self._sock.close()
            self._orphaned = True
        elif chunk:
            self._buffer += chunk
            self._take_exit()

    def _take_exit(self) -> bool:
        if b"\n" not in self._buffer:
            return False
        message = json.loads(self._buffer.split(b"\n", 1)[0])
        self.cpu_seconds = message.get("cpu_seconds")
        self.returncode = message["exit"]
        self._sock.close()
        return True


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie that its new parent has yet to reap)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def spawn(argv: list[str], env: dict[str, str], cwd: str | os.PathLike,
          log=None) -> WarmProcess | None:
    """Fork `argv` (a `python -m tasks ...` command) from the server named by
    $BERTFLOW_WARM_SOCKET with stdout and stderr on one pipe, as Popen(text=True) would give
    them; None when a warm start is not possible (the caller then starts it cold)."""
    path = os.environ.get(SOCKET_ENV)
    if not path or not is_step_command(argv):
        return None
    read_end, write_end = os.pipe()
    try:
        started = _request(path, [write_end], argv, env, cwd, log)
    finally:
        os.close(write_end)
    if started is None:
        os.close(read_end)
        return None
    sock, pid, buffer = started
    return WarmProcess(sock, pid, open(read_end, "r", errors="replace"), list(argv), buffer)


def spawn_serving(argv: list[str], env: dict[str, str], cwd: str | os.PathLike, stdout,
                  stderr) -> WarmProcess | None:
    """Fork tasks/fresh_load.py's interpreter (`argv`, its command) from the serving server
    beside $BERTFLOW_WARM_SOCKET, writing to the open files `stdout` and `stderr`; its stdin
    is the returned process's `stdin` (text). None when it must start cold."""
    path = os.environ.get(SOCKET_ENV)
    if not path:
        return None
    read_end, write_end = os.pipe()
    try:
        started = _request(path + SERVING_SUFFIX, [read_end, stdout.fileno(), stderr.fileno()],
                           argv, env, cwd)
    finally:
        os.close(read_end)
    if started is None:
        os.close(write_end)
        return None
    sock, pid, buffer = started
    return WarmProcess(sock, pid, None, list(argv), buffer, stdin=open(write_end, "w"))


def start_fresh_load(cwd: str, stdout, stderr):
    """tasks/fresh_load.py's interpreter: forked from the serving server where one runs, else
    a new process (fresh_load.popen). Both have stdin, poll, wait, kill and returncode."""
    from tasks import fresh_load

    return spawn_serving(fresh_load.command(), fresh_load.environment(), cwd, stdout,
                         stderr) or fresh_load.popen(cwd, stdout, stderr)


def _request(path: str, fds: list[int], argv: list[str], env: dict[str, str],
             cwd: str | os.PathLike, log=None) -> tuple[socket.socket, int, bytes] | None:
    """Ask the server on `path` to fork `argv` with `fds` as its standard streams: (the
    connection, the child's pid, what followed the reply) or None (start it cold)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(30)
        sock.connect(path)
        socket.send_fds(sock, [b"F"], fds)
        sock.sendall(json.dumps({"argv": list(argv), "env": env, "cwd": str(cwd)}).encode()
                     + b"\n")
        # Read on the socket itself, not a buffered file: the exit message of a process that
        # ends at once may follow in the same read, and stays for the WarmProcess.
        buffer = b""
        while b"\n" not in buffer:
            chunk = sock.recv(4096)
            if not chunk:
                raise OSError("the server closed the connection")
            buffer += chunk
        line, buffer = buffer.split(b"\n", 1)
        reply = json.loads(line)
    except (OSError, ValueError) as err:
        reply = {"cold": f"{path}: {err}"}
    if "pid" not in reply:
        sock.close()
        if log is not None:
            log(f"[cluster] cold start ({reply.get('cold')})")
        return None
    sock.settimeout(None)
    return sock, reply["pid"], buffer


# --- server ------------------------------------------------------------------------------
class Server:
    def __init__(self, path: str, serving: bool = False):
        self.path = path
        self.serving = serving  # the fresh-load check's server (tasks/fresh_load.py)
        self.children: dict[int, socket.socket] = {}
        self.stopping = False
        self.parent = os.getppid()
        self.start_env = dict(os.environ)
        # What importing sets in os.environ (TensorFlow sets TPU_ML_PLATFORM*, tasks sets its
        # defaults): a cold process would set it too, so each child gets it on top of its own.
        self.import_sets: dict[str, str] = {}

    def preload(self) -> None:
        import importlib

        from tasks import process_start

        # Frozen on the way out: the preloaded objects stay shared with the children (no
        # refcount copies), and no collection scans them.
        with process_start.imports_out_of_collection():
            for name in SERVING_PRELOAD if self.serving else PRELOAD:
                importlib.import_module(name)
        self.import_sets = {k: v for k, v in os.environ.items() if self.start_env.get(k) != v}
        from tensorflow.python.eager import context

        # A private flag, checked because a fork after the runtime started would give the
        # child thread pools without threads: a hang, not an error.
        if context.context()._initialized:  # noqa: SLF001
            raise SystemExit("warm_start: importing the steps started TensorFlow's runtime; "
                             "forking it is unsafe")

    def serve(self) -> None:
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        tmp = f"{self.path}.{os.getpid()}"
        listener.bind(tmp)
        listener.listen(64)
        os.replace(tmp, self.path)  # clients see the socket only once it is ready
        print(f"warm_start: serving on {self.path}", flush=True)
        try:
            while not self.stopping and os.getppid() == self.parent:
                try:
                    ready, _, _ = select.select([listener], [], [], 0.2)
                except InterruptedError:
                    continue
                if ready:
                    conn, _ = listener.accept()
                    self._handle(listener, conn)
                self._reap()
        finally:
            listener.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def _stop(self, signum, frame) -> None:
        self.stopping = True

    def _handle(self, listener: socket.socket, conn: socket.socket) -> None:
        try:
            conn.settimeout(30)
            _, fds, _, _ = socket.recv_fds(conn, 1, 3)
            request = json.loads(conn.makefile("rb").readline())
        except (OSError, ValueError):
            conn.close()
            return
        reason = self._refusal(request)
        wanted = 3 if self.serving else 1  # stdin, stdout, stderr; or stdout
        if reason or len(fds) != wanted:
            print(f"warm_start: refused ({reason})", flush=True)
            for fd in fds:
                os.close(fd)
            _send(conn, {"cold": reason or f"{len(fds)} descriptors, not {wanted}"})
            conn.close()
            return
        # Signals wait until the child has its own handlers: a SIGTERM that reached it while it
        # still had the server's would stop nothing but a copy of the server's loop.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED)
        pid = os.fork()
        if pid == 0:
            listener.close()
            for other in self.children.values():
                other.close()
            conn.close()
            if self.serving:
                os._exit(_run_serving_child(request, fds, self.import_sets, mask))
            os._exit(_run_child(request, fds[0], self.import_sets, mask))
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        _send(conn, {"pid": pid})
        shown = "fresh-load check" if self.serving else " ".join(request["argv"][3:])
        print(f"warm_start: pid {pid}: {shown}", flush=True)

    def _refusal(self, request: dict) -> str | None:
        from tasks import fresh_load

        argv, env = request.get("argv") or [], request.get("env") or {}
        if self.serving and argv[1:] != fresh_load.command()[1:]:
            return "not tasks/fresh_load.py's interpreter"
        if not self.serving and not is_step_command(argv):
            return f"not a step command: {argv[:3]}"
        if os.path.realpath(argv[0]) != os.path.realpath(sys.executable):
            return f"another interpreter: {argv[0]}"
        ours, theirs = import_env(self.start_env), import_env(env)
        differ = sorted(k for k in ours.keys() | theirs.keys()
                        if ours.get(k) != theirs.get(k) and k not in self.import_sets)
        return f"import-time environment differs: {', '.join(differ)}" if differ else None

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    _send(conn, {"exit": os.waitstatus_to_exitcode(status),
                                 "cpu_seconds": usage.ru_utime + usage.ru_stime})
                conn.close()


_HANDLED = {signal.SIGTERM, signal.SIGINT}  # the signals the server has handlers for


def _send(conn: socket.socket, message: dict) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def _run_child(request: dict, out_fd: int, import_sets: dict[str, str], mask) -> int:
    """In the forked process: become what `python -m tasks ARGS` would be, run it, end as it
    would end. Returns the exit code."""
    import runpy

    from tasks import process_end

    null = os.open(os.devnull, os.O_RDONLY)
    _become_a_new_process(request, [null, out_fd, out_fd], import_sets, mask)
    os.close(null)
    os.close(out_fd)
    sys.argv = [request["argv"][0], *request["argv"][3:]]
    code = _exit_code_of(lambda: runpy.run_module("tasks", run_name="__main__",
                                                  alter_sys=True))
    process_end.finish()
    return code


def _run_serving_child(request: dict, fds: list[int], import_sets: dict[str, str],
                       mask) -> int:
    """In a fork of the serving server: run tasks/fresh_load.py's script as `python -c` would,
    with the request's stdin, stdout and stderr, outside the project (its modules dropped,
    the checkout off sys.path, as in an interpreter started in a temporary folder)."""
    from tasks import fresh_load

    _become_a_new_process(request, fds, import_sets, mask)
    for fd in set(fds):
        os.close(fd)
    for name in [m for m in sys.modules if m == "tasks" or m.startswith("tasks.")]:
        del sys.modules[name]
    sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd(), str(_CHECKOUT))]
    sys.argv = ["-c"]
    code = _exit_code_of(lambda: exec(compile(fresh_load.SCRIPT, "<string>", "exec"),
                                      {"__name__": "__main__"}))
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    return code


_CHECKOUT = Path(__file__).resolve().parents[3]  # the folder that holds `tasks`


def _become_a_new_process(request: dict, std_fds: list[int], import_sets: dict[str, str],
                          mask) -> None:
    """What a fresh process has: default signal handlers, its own session, `std_fds` as
    stdin, stdout and stderr, the request's cwd and environment, fresh random seeds."""
    import random

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.setsid()  # its own process group, as LocalCluster's start_new_session
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # what came meanwhile acts now
    for target, fd in enumerate(std_fds):
        os.dup2(fd, target)
    os.chdir(request["cwd"])
    os.environ.clear()  # in place: modules hold os.environ itself
    os.environ.update(request["env"])
    os.environ.update(import_sets)
    tempfile.tempdir = None  # TMPDIR is per process (LocalCluster sets it per role)
    random.seed()
    try:
        import numpy
        numpy.random.seed()
    except ImportError:
        pass


def _exit_code_of(run) -> int:
    """Call `run` as the interpreter runs a program: its exit code, a traceback on stderr
    for an uncaught exception."""
    try:
        run()
    except SystemExit as stop:
        return _exit_code(stop.code)
    except BaseException:
        import traceback

        traceback.print_exc()
        return 1
    return 0


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def start(path: str | os.PathLike, env: dict[str, str] | None = None,
          log_path: str | os.PathLike | None = None, timeout: float = 120) -> subprocess.Popen:
    """Start a server on `path` in the environment its children will be asked for, and wait
    until it serves. Stop it with terminate()."""
    from tasks.provision.spec import BASE_ENV, process_env

    path = Path(path)
    with contextlib.suppress(OSError):
        path.unlink()
    # What LocalCluster gives a step process (tasks/provision/local/cluster.py), less the per-process
    # parts: the import-time environment the children will be asked for.
    env = process_env(os.environ if env is None else env, BASE_ENV)
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen([sys.executable, "-m", "tasks.provision.local.warm_start",
                             "--socket", str(path)], env=env, stdin=subprocess.DEVNULL,
                            stdout=out, stderr=subprocess.STDOUT)
    if log_path:
        out.close()
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"warm_start server did not start (exit {proc.poll()})")
        time.sleep(0.1)
    return proc


# A Unix socket's path has at most 107 bytes (sun_path is 108 with its NUL, on Linux). The
# server binds "socket.PID" first (serve), its serving server "socket.serving.PID": the longest
# PID has 7 digits (pid_max 2^22).
MAX_SOCKET_PATH = 107
BIND_NAME = "socket" + SERVING_SUFFIX + ".4194304"


def socket_folder() -> str:
    """A fresh private folder for the server's socket: in $TMPDIR, or in /tmp where $TMPDIR
    is too deep for a socket path (a deep $TMPDIR would otherwise stop the server at bind)."""
    folder = tempfile.mkdtemp(prefix="bertflow-warm-")
    if len(os.fsencode(os.path.join(folder, BIND_NAME))) <= MAX_SOCKET_PATH:
        return folder
    os.rmdir(folder)
    return tempfile.mkdtemp(prefix="bertflow-warm-", dir="/tmp")


@contextlib.contextmanager
def serving(env: dict[str, str] | None = None, log_path: str | os.PathLike | None = None):
    """A server for the duration of a block, on a socket in a fresh private folder; yields
    the socket path, to be set as $BERTFLOW_WARM_SOCKET where steps are started."""
    folder = socket_folder()
    path = Path(folder) / "socket"
    proc = start(path, env, log_path)
    try:
        yield path
    finally:
        _stop(proc)
        shutil.rmtree(folder, ignore_errors=True)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM a server, SIGKILL it after 30 s, and reap it."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.provision.local.warm_start",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--socket", required=True, help="Unix socket path to serve on")
    parser.add_argument("--serving", action="store_true",
                        help="serve tasks/fresh_load.py's interpreter (the steps' server "
                             "starts one on SOCKET.serving)")
    args = parser.parse_args(argv)
    server = Server(args.socket, serving=args.serving)
    serving = None if args.serving else _start_serving(args.socket + SERVING_SUFFIX)
    try:
        server.preload()
        server.serve()
    finally:
        if serving is not None:
            _stop(serving)
    return 0


def _start_serving(path: str) -> subprocess.Popen:
    """The serving server, as a new interpreter (not a fork: it must never have imported
    bertflow's model), in tasks/fresh_load.py's environment and a folder outside the
    checkout; it logs to this server's output and ends when this server does."""
    from tasks import fresh_load

    return subprocess.Popen([sys.executable, "-m", "tasks.provision.local.warm_start",
                             "--socket", path, "--serving"], env=fresh_load.environment(),
                            cwd=os.path.dirname(path) or ".", stdin=subprocess.DEVNULL)


if __name__ == "__main__":
    sys.exit(main())
