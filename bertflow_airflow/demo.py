"""`make demo`: run the bert_finetune DAG end to end on the demo data set, then load the
exported model in a fresh process (TensorFlow + tensorflow-text only, not this project) and
print two of its predictions. The console gets one line per task (task, state, seconds) and
the summary; Airflow's and the tasks' full log goes to a file whose path is printed first.

`make airflow` (`--ui`): the Airflow UI, scheduler and dag-processor (`airflow standalone`)
on the same metadata DB, until Ctrl-C.

Airflow runs from $AIRFLOW_HOME (the Makefile sets the project's .airflow/ folder: SQLite
metadata DB, created on first use) with dags/ and plugins/ from this checkout. A demo-sized
config (short sequences, 2 epochs on ~300 rows) finishes in a few minutes on 2 CPUs.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterator, TextIO

from bertflow_airflow import sqlite_metadata, subreaper
from tasks import fresh_load
from tasks.config import DEMO_DIR, PROJECT_ROOT

from tasks.io.uris import join_uri

DAG_ID = "bert_finetune"
# The demo evaluates on its own hand-written eval file (RunConfig's eval_uri is empty: a train
# file given alone is split).
DEMO_CONF = {"train_uri": str(DEMO_DIR / "train.tsv"), "eval_uri": str(DEMO_DIR / "eval.tsv"),
             "max_seq_length": 64, "epochs": 2, "per_replica_batch_size": 16,
             "learning_rate": 1e-4, "checkpoint_every_steps": 20}

def default_airflow_home() -> Path:
    """$AIRFLOW_HOME if set (the Makefile sets the project's .airflow/), else .airflow/."""
    return Path(os.environ.get("AIRFLOW_HOME") or PROJECT_ROOT / ".airflow").resolve()


def airflow_env(airflow_home: Path) -> dict[str, str]:
    return {
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        **sqlite_metadata.env(os.environ),
    }


def predict_in_fresh_process(saved_model_dir: str, rows: list[dict]) -> list[dict]:
    """rows: [{"text": ...} or {"text": ..., "text_pair": ...}] -> [{"label", "probabilities"}],
    from an interpreter with nothing but TensorFlow and tensorflow-text (tasks/fresh_load.py):
    the SavedModel serves raw strings on its own."""
    out = fresh_load.predict(saved_model_dir, {k: [r[k] for r in rows] for k in rows[0]})
    return [{"label": label, "probabilities": [round(x, 4) for x in probs]}
            for label, probs in zip(out["label"], out["probabilities"])]


def load_dag():
    """bert_finetune, parsed from its own file only: dag.test() parses the whole dags/ folder
    again anyway (to sync it to the metadata DB); parsing the other DAG files here as well
    cost ~0.2 s of CPU per run (bert_sweep builds 17 tasks, each with a copy of 110 Params)."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(PROJECT_ROOT / "dags" / f"{DAG_ID}.py"))
    if bag.import_errors:
        raise RuntimeError(f"DAG import errors: {bag.import_errors}")
    return bag.dags[DAG_ID]


def run_dag(conf: dict):
    """Run the DAG once through dag.test(); returns the DagRun."""
    return load_dag().test(run_conf=conf)


# --- quiet run: progress lines on the console, the full log in a file -----------------------

FINISHED = ("success", "failed", "skipped", "upstream_failed", "up_for_retry",
            "up_for_reschedule", "removed")


def progress_line(task_id: str, state: str, seconds: float | None, try_number: int = 1) -> str:
    """`  train          success       42.3 s` (one per finished task attempt)."""
    took = f"{seconds:8.1f} s" if seconds is not None else "       - s"
    attempt = f"  (try {try_number})" if try_number > 1 else ""
    return f"  {task_id:<14} {state:<15}{took}{attempt}"


class TaskProgress(threading.Thread):
    """Prints a progress line whenever a task attempt of the newest run of `dag_id` (one
    created after `after_run_id`) finishes, reading the metadata DB once a second: works
    whatever runs the tasks (dag.test in this process, an executor, a scheduler)."""

    def __init__(self, dag_id: str, after_run_id: int, out: TextIO, interval: float = 1.0):
        super().__init__(name="bertflow-progress", daemon=True)
        self.dag_id, self.after_run_id, self.out, self.interval = \
            dag_id, after_run_id, out, interval
        self.reported: set[tuple[str, int]] = set()
        self._done = threading.Event()
        self._lock = threading.Lock()

    @staticmethod
    def newest_run_id(dag_id: str) -> int:
        from sqlalchemy import func, select

        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session

        with create_session() as session:
            return session.scalar(select(func.max(DagRun.id)).where(
                DagRun.dag_id == dag_id)) or 0

    def poll(self) -> None:
        from sqlalchemy import select

        from airflow.models.dagrun import DagRun
        from airflow.models.taskinstance import TaskInstance as TI
        from airflow.utils.session import create_session

        with self._lock, create_session() as session:
            run_id = session.scalar(
                select(DagRun.run_id).where(DagRun.dag_id == self.dag_id,
                                            DagRun.id > self.after_run_id)
                .order_by(DagRun.id.desc()).limit(1))
            if run_id is None:
                return
            rows = session.execute(
                select(TI.task_id, TI.state, TI.try_number, TI.start_date, TI.end_date,
                       TI.duration)
                .where(TI.dag_id == self.dag_id, TI.run_id == run_id)).all()
            done = []
            for task_id, state, try_number, start, end, duration in rows:
                state = getattr(state, "value", state)
                key = (task_id, try_number or 1)
                if state in FINISHED and key not in self.reported:
                    self.reported.add(key)
                    if duration is None and start and end:
                        duration = (end - start).total_seconds()
                    done.append((end.timestamp() if end else float("inf"), task_id, state,
                                 duration, try_number or 1))
            for _, task_id, state, duration, try_number in sorted(done):
                print(progress_line(task_id, state, duration, try_number), file=self.out,
                      flush=True)

    def run(self) -> None:
        while not self._done.wait(self.interval):
            try:
                self.poll()
            except Exception:  # noqa: BLE001  a busy SQLite DB: try again next second
                pass

    def finish(self) -> None:
        """Stop polling and report what finished since the last poll."""
        self._done.set()
        self.join(timeout=30)
        self.poll()


@contextlib.contextmanager
def output_to(log_path: Path):
    """Send everything written to stdout/stderr (Python's streams and file descriptors 1
    and 2, so worker processes and C++ logging too) to `log_path`; yields the console."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    console = os.fdopen(os.dup(sys.__stdout__.fileno()), "w", buffering=1)
    saved_fds = os.dup(1), os.dup(2)
    saved_streams = sys.stdout, sys.stderr
    log = open(log_path, "a", buffering=1, encoding="utf-8", errors="replace")
    try:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = sys.stderr = log
        yield console
    finally:
        for stream in (sys.stdout, sys.stderr, *saved_streams):
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdout, sys.stderr = saved_streams
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
        os.close(saved_fds[0])
        os.close(saved_fds[1])
        log.close()
        console.flush()


def run_dag_quietly(conf: dict, log_path: Path, out: TextIO | None = None, **test_kwargs):
    """run_dag() with Airflow's output in `log_path` and one progress line per task on
    `out` (the console by default). `test_kwargs` go to dag.test (e.g.
    mark_success_pattern)."""
    with output_to(log_path) as console:
        out = out or console
        dag = load_dag()
        progress = TaskProgress(DAG_ID, TaskProgress.newest_run_id(DAG_ID), out)
        progress.start()
        try:
            return dag.test(run_conf=conf, **test_kwargs)
        finally:
            progress.finish()


def run_folder(dag_run, artifact_root: str) -> str:
    from tasks.runs.runlayout import RunContext, run_key_for

    run_type = getattr(dag_run.run_type, "value", dag_run.run_type)
    return RunContext(artifact_root, DAG_ID, run_key_for(run_type, None, dag_run.run_id)).run_uri


def sample_rows(run_uri: str, count: int = 2) -> list[dict]:
    """The first rows of the run's evaluation split, as serving inputs."""
    from tasks.io import storage

    manifest = storage.read_json(join_uri(run_uri, "data", "manifest.json"))
    first_shard = manifest["splits"]["eval"]["shards"][0]
    from tasks.io.chunked_reader import line_blocks

    # The first block of whole lines: a streaming read, never the whole shard.
    block = next(line_blocks(storage.iter_bytes(first_shard, 1 << 16)))
    rows = [json.loads(line) for line in block.decode("utf-8").splitlines()[:count]]
    return [{"text": r["text"], **({"text_pair": r["text_pair"]} if r.get("text_pair") else {})}
            for r in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bertflow_airflow.demo", description=__doc__)
    parser.add_argument("--num-workers", type=int, default=1,
                        help="worker processes; 2 trains with MultiWorkerMirroredStrategy")
    parser.add_argument("--ui", action="store_true",
                        help="start the Airflow UI (airflow standalone) instead; Ctrl-C stops")
    parser.add_argument("--port", type=int, default=8080, help="with --ui: the UI's port")
    parser.add_argument("--verbose", action="store_true",
                        help="print Airflow's full log instead of one line per task")
    args = parser.parse_args(argv)

    airflow_home = default_airflow_home()
    if args.ui:
        return serve_ui(airflow_home, args.port)
    os.environ.update(airflow_env(airflow_home))  # before Airflow is first imported
    if not (airflow_home / "airflow.db").exists():
        print(f"Creating the Airflow metadata DB in {airflow_home} ...", flush=True)
        subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"],
                       check=True, stdout=subprocess.DEVNULL)

    from tasks.io import storage
    from tasks.config import parse_config

    conf = {**DEMO_CONF, "num_workers": args.num_workers}
    cfg = parse_config(conf)
    with _warm_steps(airflow_home, os.environ) as env:
        os.environ.update(env)  # dag.test() runs the tasks, and their LocalClusters, here
        if args.verbose:
            dag_run = run_dag(conf)
            where = "the task logs above"
        else:
            log_path = airflow_home / "logs" / f"demo-{datetime.now():%Y%m%d-%H%M%S}.log"
            print(f"Running {DAG_ID} on the demo data; Airflow's full log: {log_path}",
                  flush=True)
            started = time.monotonic()
            dag_run = run_dag_quietly(conf, log_path)
            print(f"  {'(DAG run)':<14} {dag_run.state:<15}{time.monotonic() - started:8.1f} s")
            where = log_path
        for name in env:
            os.environ.pop(name)
    run_uri = run_folder(dag_run, cfg.artifact_root)
    print(f"\nDAG run {dag_run.run_id}: {dag_run.state}; run folder {run_uri}")
    if dag_run.state != "success":
        print(f"The run failed; see {where}.", file=sys.stderr)
        return 1

    exported = storage.read_json(join_uri(run_uri, "export", "manifest.json"))
    metrics = storage.read_json(join_uri(run_uri, "evaluate", "manifest.json"))["metrics"]
    promoted = storage.read_json(join_uri(run_uri, "promote", "manifest.json"))
    tokenized = storage.read_json(join_uri(run_uri, "tokenize", "manifest.json"))
    print(f"Tokenized data: {tokenized['cache_uri']} "
          f"({'reused from an earlier run' if tokenized['reused'] else 'new'})")
    print(f"Exported model: {exported['version_uri']}")
    print(f"Eval metrics:   {json.dumps(metrics)}")
    print(f"Promoted:       {promoted['promoted']}: {promoted['reason']}")
    rows = sample_rows(run_uri)
    with storage.staged_local_dir(join_uri(exported["version_uri"], "saved_model")) as path:
        predictions = predict_in_fresh_process(str(path), rows)
    for row, pred in zip(rows, predictions):
        print(f"  {row} -> {pred['label']} {pred['probabilities']}")
    return 0


@contextlib.contextmanager
def _warm_steps(airflow_home: Path, env) -> Iterator[dict[str, str]]:
    """A warm-start server for the step processes of this demo or UI session, started in
    `env` (the environment the tasks run in); yields the variable that points them at it.
    Each step process then skips ~4 s of imports (tasks/provision/local/warm_start.py)."""
    from tasks.provision.local import warm_start

    with warm_start.serving(dict(env), airflow_home / "logs" / "warm_start.log") as path:
        yield {warm_start.SOCKET_ENV: str(path)}


# --- `make airflow`: the UI on the embedded default ---------------------------------------

def _pids_with(marker: bytes) -> list[int]:
    """Processes whose environment holds `marker` (NAME=value): everything started for one
    UI session, including task workers in their own process groups."""
    import psutil

    name, _, value = marker.decode().partition("=")
    pids = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(name) == value:
                pids.append(proc.pid)
        except (psutil.Error, OSError):  # gone, a zombie, or another user's
            continue
    return pids


def _pids_in_sessions(sessions: list[int]) -> list[int]:
    """Processes of these sessions (standalone's, a restarted scheduler's) that have not
    ended: a scheduler's log server and executor workers overwrite their environment with
    process titles, so _pids_with misses them, and they outlive a scheduler that died."""
    import psutil

    pids = []
    for pid in psutil.pids():
        with contextlib.suppress(OSError, psutil.Error):
            if pid != os.getpid() and os.getsid(pid) in sessions and \
                    not _exited(psutil.Process(pid)):
                pids.append(pid)
    return pids


def _stop_standalone(proc: subprocess.Popen, marker: bytes,
                     sessions: list[int] = ()) -> list[int]:
    """Ask standalone to shut down (SIGINT, as Ctrl-C would), then TERM/KILL whatever is
    left of the session, and of `sessions` (schedulers started again). Returns pids that
    survived (should be none)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    def left() -> list[int]:
        return sorted(set(_pids_with(marker)) | set(_pids_in_sessions(list(sessions))))

    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        for pid in left():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while (remaining := left()) and time.monotonic() < deadline:
            time.sleep(0.5)
        if not remaining:
            break
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    return left()


def _port_in_use(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_ui(airflow_home: Path, port: int, ready_timeout: float = 300) -> int:
    """`airflow standalone` (api-server, scheduler, dag-processor, triggerer) on the demo's
    metadata DB and this checkout's dags and plugins; prints the URL and the login; stops
    every process it started on Ctrl-C (or SIGTERM)."""
    if _port_in_use(port):
        print(f"Port {port} is in use; choose another: make airflow PORT=8081", file=sys.stderr)
        return 2
    airflow_home.mkdir(parents=True, exist_ok=True)
    venv_bin = str(Path(sys.executable).parent)
    session = uuid.uuid4().hex
    base = f"http://localhost:{port}"
    env = {**os.environ, **airflow_env(airflow_home),
           "AIRFLOW__API__PORT": str(port),
           # Task supervisors call the execution API; the default is :8080 whatever the port.
           "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base}/execution/",
           "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
           "TF_USE_LEGACY_KERAS": "1",
           "BERTFLOW_UI_SESSION": session}
    env.pop("PYTHONPATH", None)
    # The task and triggerer log servers have fixed ports too; move them if those are taken
    # (another Airflow on this machine), or the UI cannot show task logs.
    for key, default in (("AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT", 8793),
                         ("AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT", 8794)):
        if key not in env and _port_in_use(default):
            env[key] = str(_free_port())
    marker = f"BERTFLOW_UI_SESSION={session}".encode()
    log_path = airflow_home / "logs" / "standalone.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    passwords = airflow_home / "simple_auth_manager_passwords.json.generated"

    # Ctrl-C reaches make and this process (the terminal's process group); standalone runs in
    # its own session and is stopped by _stop_standalone. SIGTERM (e.g. from make) does too.
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    print(f"Starting Airflow (api-server, scheduler, dag-processor, triggerer) in {airflow_home}"
          f"\n  log: {log_path}", flush=True)
    with _warm_steps(airflow_home, env) as warm_env:
        env.update(warm_env)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([os.path.join(venv_bin, "airflow"), "standalone"],
                                    env=env, cwd=str(airflow_home), stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        rc, sessions = 1, [proc.pid]  # standalone's session, then restarted schedulers'
        try:
            rc = _announce(proc, base, passwords, log_path, ready_timeout)
            if rc == 0:
                rc = _wait_keeping_the_scheduler(
                    proc, env, airflow_home, log_path,
                    lambda: scheduler_heartbeat_age(base), sessions=sessions)
        except KeyboardInterrupt:
            rc = 0
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not orphan
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            print("\nStopping Airflow ...", flush=True)
            left = _stop_standalone(proc, marker, sessions)
            if left:
                print(f"processes still running: {left}", file=sys.stderr)
            else:
                print("Stopped; no Airflow process left.", flush=True)
    return 1 if left else rc


def _announce(proc: subprocess.Popen, base: str, passwords: Path, log_path: Path,
              ready_timeout: float) -> int:
    """Wait until the api-server and scheduler answer, then print the URL and login: 0.
    1 if standalone dies or never gets ready."""
    deadline = time.monotonic() + ready_timeout
    while True:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace").splitlines()[-30:]
            print(f"airflow standalone exited with {proc.returncode}:\n" + "\n".join(tail),
                  file=sys.stderr)
            return 1
        health = _health(base) or {}
        if health.get("scheduler", {}).get("status") == "healthy" and passwords.exists():
            break
        if time.monotonic() > deadline:
            print(f"Airflow not ready after {ready_timeout:.0f}s; see {log_path}",
                  file=sys.stderr)
            return 1
        time.sleep(1)
    users = json.loads(passwords.read_text())
    print(f"\nAirflow is up: {base}", flush=True)
    for user, password in users.items():
        print(f"  log in as {user!r} with password {password!r}")
    print(f"  (simple auth manager; passwords in {passwords})\n"
          "Ctrl-C stops Airflow and every process it started.", flush=True)
    return 0


# How often the scheduler is looked at; how long a restarted one must live for the next exit
# to be restarted too (one that keeps failing is left stopped, with its log); how long without
# a heartbeat makes a scheduler hung. Airflow calls it unhealthy after 30 s
# ([scheduler] scheduler_health_check_threshold); 90 s leaves room for a loaded machine.
SCHEDULER_CHECK_S = 5.0
SCHEDULER_MIN_LIFE_S = 120.0
SCHEDULER_STALE_S = 90.0


def _health(base: str) -> dict | None:
    """The api-server's health report (`/api/v2/monitor/health`, open without a login), or
    None while it does not answer."""
    import httpx

    try:
        return httpx.get(f"{base}/api/v2/monitor/health", timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return None


def scheduler_heartbeat_age(base: str) -> float | None:
    """Seconds since the newest scheduler heartbeat that the health report gives; None if
    it does not say."""
    try:
        beat = _health(base)["scheduler"]["latest_scheduler_heartbeat"]
        return time.time() - datetime.fromisoformat(beat.replace("Z", "+00:00")).timestamp()
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _standalone_scheduler(proc: subprocess.Popen):
    """standalone's `airflow scheduler` process (psutil), or None."""
    import psutil

    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(proc.pid).children():
            with contextlib.suppress(psutil.Error):
                if child.cmdline()[-1:] == ["scheduler"]:
                    return child
    return None


def _exited(process) -> bool:
    """A psutil process that has ended (standalone does not reap its components: a zombie)."""
    import psutil

    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _await_exit(process, timeout: float = subreaper.REAP_TIMEOUT_S) -> None:
    """Until the psutil `process` (a scheduler just killed, or found ended) has exited, at
    most `timeout` seconds: from then on its children are orphans of this process."""
    deadline = time.monotonic() + timeout
    while not _exited(process) and time.monotonic() < deadline:
        time.sleep(0.05)


def _hung_for(process, heartbeat_age: Callable[[], float | None]) -> float | None:
    """Seconds without a heartbeat, if the scheduler `process` has lived SCHEDULER_STALE_S
    and the newest heartbeat is older than that (a new one has time to make its first)."""
    import psutil

    with contextlib.suppress(psutil.Error):
        if time.time() - process.create_time() > SCHEDULER_STALE_S:
            age = heartbeat_age()
            if age is not None and age > SCHEDULER_STALE_S:
                return age
    return None


def _descendants(process) -> list:
    import psutil

    with contextlib.suppress(psutil.Error):
        return process.children(recursive=True)
    return []


def _kill_all(processes) -> None:
    """SIGKILL each psutil process still running (psutil refuses a pid taken by another)."""
    import psutil

    for member in processes:
        with contextlib.suppress(psutil.Error):
            member.kill()


def _wait_keeping_the_scheduler(proc: subprocess.Popen, env: dict[str, str],
                                airflow_home: Path, log_path: Path,
                                heartbeat_age: Callable[[], float | None],
                                command: list[str] | None = None,
                                sessions: list[int] | None = None) -> int:
    """Wait for Ctrl-C (KeyboardInterrupt); 1 if standalone exits. standalone does not start
    a component again, and after an error Airflow does not survive (the SQLite race after a
    refused backfill, docs/experiments.md) its scheduler either exits or hangs in its
    shutdown, waiting for executor workers that never finish. Either way no run moves while
    the UI still answers. So a scheduler that exits, or that has not heartbeat for
    SCHEDULER_STALE_S (`heartbeat_age`: seconds since the newest heartbeat) and is then
    killed with its children, is followed by a new `airflow scheduler` in the same
    environment and log, unless the one started last ended within SCHEDULER_MIN_LIFE_S.
    What an ended scheduler leaves (executor workers, task processes, its log server) is
    killed first: this process adopts every orphan of its descendants (bertflow_airflow/
    subreaper.py) and ends each one at every look, and all an ended scheduler left before
    its replacement starts; those a scheduler had when last seen are killed too (all there
    is where no subreaper can be had).
    `command`: what starts one (`airflow scheduler` of this venv). Each one runs in a
    session of its own, whose id is appended to `sessions` for _stop_standalone."""
    with subreaper.adopting_orphans():
        keep = subreaper.own_children()  # standalone, the warm-start server
        try:
            return _keep_the_scheduler(proc, env, airflow_home, log_path, heartbeat_age,
                                       command, sessions, keep)
        finally:
            subreaper.end_orphans(keep)


def _keep_the_scheduler(proc, env, airflow_home, log_path, heartbeat_age, command, sessions,
                        keep: set[int]) -> int:
    """_wait_keeping_the_scheduler's loop; `keep`: this process's children that are not
    orphans (replacement schedulers are added)."""
    import psutil

    command = command or [os.path.join(os.path.dirname(sys.executable), "airflow"),
                          "scheduler"]
    scheduler = _standalone_scheduler(proc)
    family: list = []  # the scheduler's descendants when last seen alive
    replacement: subprocess.Popen | None = None
    started = 0.0
    while proc.poll() is None:
        time.sleep(SCHEDULER_CHECK_S)
        if replacement is not None:
            replacement.poll()  # reaped, so that its exit shows
        subreaper.end_orphans(keep)
        if proc.poll() is not None:  # standalone ended: the orphans were its components
            break
        if scheduler is None:
            continue
        if _exited(scheduler):
            ended = "exited" + ("" if replacement is None
                                else f" (exit {replacement.returncode})")
        elif (silent := _hung_for(scheduler, heartbeat_age)) is not None:
            family = [scheduler, *_descendants(scheduler)]
            ended = f"made no heartbeat for {silent:.0f}s; killed it"
        else:
            family = _descendants(scheduler)
            continue
        # A hung scheduler is killed with its children. One that was killed leaves its
        # executor workers, task processes and log server (which keeps the log port from the
        # next one's) running as orphans. Once it has ended, all it left are orphans of this
        # process, those born after the last look too: ended before another one starts.
        _kill_all(family)
        family = []
        _await_exit(scheduler)
        subreaper.end_orphans(keep)
        if replacement is not None and time.monotonic() - started < SCHEDULER_MIN_LIFE_S:
            print(f"Airflow's scheduler {ended}, within {SCHEDULER_MIN_LIFE_S:.0f}s of its "
                  f"restart; not starting it again: no run will move. See {log_path}; "
                  "Ctrl-C stops Airflow.", file=sys.stderr, flush=True)
            scheduler = None
            continue
        print(f"Airflow's scheduler {ended}; starting it again (see {log_path}).",
              file=sys.stderr, flush=True)
        with open(log_path, "ab") as log:
            replacement = subprocess.Popen(command, env=env, cwd=str(airflow_home),
                                           stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True)
        keep.add(replacement.pid)
        if sessions is not None:
            sessions.append(replacement.pid)
        scheduler, started = psutil.Process(replacement.pid), time.monotonic()
    print(f"airflow standalone exited with {proc.returncode}; see {log_path}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
