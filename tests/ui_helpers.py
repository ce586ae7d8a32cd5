"""Helpers for the tests against a real Airflow: `airflow standalone` in its own process group
(`Standalone`), the README's `make airflow` (`MakeAirflow`), a small REST client, and a
headless Chromium driven through the DevTools protocol (plain `websockets`, no Playwright,
nothing downloaded at run time)."""
from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bertflow_airflow import sqlite_metadata
from tasks.provision.local import warm_start

PROJECT_ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1400,1800"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Settings of every test Airflow server, the one `make airflow` starts included.
TEST_SERVER_ENV = {
    # The DAG files do not change while a test runs; Airflow re-parses each one every 30 s by
    # default ([dag_processor] min_file_process_interval), a process importing Airflow each
    # time: about 45 CPU-seconds in test_airflow_standalone's 7 minutes.
    "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3600",
    # Task supervisors talk to the api-server over HTTP; the defaults (5 s timeout, 5 retries)
    # kill tasks when a loaded machine stalls the api-server for ~30 s.
    "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
    "AIRFLOW__WORKERS__EXECUTION_API_RETRIES": "10",
    # Each component's log lines reach the server's log as they are written (standalone
    # prints to a file, its components to pipes: block-buffered otherwise). Tests wait on
    # the scheduler's lines (test_airflow_standalone's approvals).
    "PYTHONUNBUFFERED": "1",
}


class Standalone:
    """`airflow standalone` on a free port with a tmp AIRFLOW_HOME and one real user."""

    user = "tester"

    def __init__(self, home: Path, artifact_root: Path, extra_env: dict[str, str] | None = None):
        self.home = home
        self.extra_env = dict(extra_env or {})  # e.g. a PostgreSQL metadata DB, a schedule
        self.artifact_root = artifact_root
        self.port = free_port()
        self.log_ports = (free_port(), free_port())
        self.base = f"http://localhost:{self.port}"
        self.password = secrets.token_urlsafe(16)
        self.log_path = home / "standalone.log"
        self.proc: subprocess.Popen | None = None
        self._token: str | None = None
        self._resources = contextlib.ExitStack()  # what start() opened beside Airflow

    def env(self) -> dict[str, str]:
        passwords = self.home / "passwords.json"
        passwords.write_text(json.dumps({self.user: self.password}))
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("AIRFLOW__") and k != "PYTHONPATH"}
        env.update({
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__API__PORT": str(self.port),
            # The log servers' defaults (8793, 8794) are taken when another Airflow runs here
            # (test files run in parallel).
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.log_ports[0]),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(self.log_ports[1]),
            # Without it the task supervisor calls the default :8080 and every task fails.
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{self.user}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            # Parse the dags folder soon after start, not after the default 5 minutes.
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
            **TEST_SERVER_ENV,
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "BERTFLOW_ARTIFACT_ROOT": str(self.artifact_root),
            "TF_USE_LEGACY_KERAS": "1",
            "TF_CPP_MIN_LOG_LEVEL": "2",
        })
        env.update(self.extra_env)
        env.update(sqlite_metadata.env(env))  # as `make airflow` sets it, on SQLite only
        return env

    def cli(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        """Run `airflow ARGS...` against this server's metadata DB and config."""
        return subprocess.run([str(VENV_BIN / "airflow"), *args], env=self.env(),
                              cwd=str(self.home), capture_output=True, text=True,
                              timeout=timeout)

    def start(self, timeout: float = 240) -> None:
        # Step processes fork from a warm-start server (tasks/provision/local/warm_start.py) started
        # in the environment Airflow's task processes get, as a user running Airflow would.
        self.extra_env[warm_start.SOCKET_ENV] = str(self._resources.enter_context(
            warm_start.serving(self.env(), self.home / "warm_start.log")))
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([str(VENV_BIN / "airflow"), "standalone"], env=self.env(),
                                     cwd=str(self.home), stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"airflow standalone exited with {self.proc.returncode}\n"
                                   + self.log_tail())
            try:
                health = httpx.get(f"{self.base}/api/v2/monitor/health", timeout=5)
                if health.status_code == 200 and \
                        health.json().get("scheduler", {}).get("status") == "healthy":
                    # the execution API answers too (what every task's supervisor calls)
                    if httpx.get(f"{self.base}/execution/health", timeout=60).status_code == 200:
                        return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise RuntimeError(f"airflow standalone not healthy after {timeout:.0f}s\n"
                           + self.log_tail())

    def log_tail(self, lines: int = 80) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no standalone log)"
        return "---- airflow standalone log (tail) ----\n" + "\n".join(text[-lines:])

    def _our_pids(self) -> list[int]:
        """Processes started for this server (found by its unique AIRFLOW_HOME / artifact
        root), including task workers that run in their own sessions; and processes whose
        working folder is the home (Airflow's process titles overwrite the environment that
        /proc shows, for the scheduler's log server and executor workers)."""
        marks = (f"AIRFLOW_HOME={self.home}".encode(),
                 f"BERTFLOW_ARTIFACT_ROOT={self.artifact_root}".encode())
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    continue  # a zombie: ended, waiting to be reaped
                environ = (entry / "environ").read_bytes().split(b"\0")
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if any(m in environ for m in marks) or cwd == str(self.home):
                pids.append(int(entry.name))
        return pids

    def stop(self) -> list[int]:
        """Stop the process group, then anything else that still carries our env.
        Returns pids that survived SIGKILL (should be empty)."""
        if self.proc is None:
            return []
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        # The warm-start server: outside standalone's group but in our environment, so the
        # wait below would give it its whole 15 s, then SIGKILL it.
        self._resources.close()
        deadline = time.monotonic() + 15
        while self._our_pids() and time.monotonic() < deadline:
            time.sleep(1)
        for pid in self._our_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        self._resources.close()
        time.sleep(1)
        return self._our_pids()

    # --- REST ---------------------------------------------------------------------------

    @property
    def token(self) -> str:
        if self._token is None:
            resp = httpx.post(f"{self.base}/auth/token", timeout=30,
                              json={"username": self.user, "password": self.password})
            assert resp.status_code in (200, 201), resp.text
            self._token = resp.json()["access_token"]
        return self._token

    def api(self, method: str, path: str, **kwargs) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}", **kwargs.pop("headers", {})}
        return httpx.request(method, f"{self.base}/api/v2{path}", headers=headers,
                             timeout=kwargs.pop("timeout", 60), **kwargs)

    def wait_for(self, what: str, check, timeout: float, interval: float = 3):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                result = check()
            except httpx.HTTPError as err:  # a loaded machine: slow answers are not failures
                print(f"waiting for {what}: {err!r}")
                result = None
            if result:
                return result
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"airflow standalone died waiting for {what}\n"
                                   + self.log_tail())
            time.sleep(interval)
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}\n"
                           + self.log_tail())


def _as_from_a_terminal() -> None:
    """Ctrl-C and Ctrl-\\ act as in a terminal. A test run started in the background
    (`cmd &` in a script, nohup) ignores SIGINT and SIGQUIT, and a child inherits ignored
    signals: make and bertflow_airflow.demo would never see the test's Ctrl-C."""
    for sig in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


class MakeAirflow(Standalone):
    """The README's third command, `make airflow PORT=... AIRFLOW_HOME=...`, run as a user
    would: its own environment without AIRFLOW__ settings (but for TEST_SERVER_ENV: the task
    supervisors' patience with a loaded api-server, DAG files parsed once), logged into with
    the login it prints. `interrupt()` is Ctrl-C (SIGINT to make's process group, as a
    terminal sends it)."""

    LOGIN = re.compile(r"log in as '([^']+)' with password '([^']+)'")

    def __init__(self, home: Path, artifact_root: Path, extra_env: dict[str, str] | None = None):
        super().__init__(home, artifact_root, extra_env)
        self.user = self.password = None
        self.log_path = home / "logs" / "standalone.log"  # where bertflow_airflow.demo --ui writes it
        self.lines: list[str] = []

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("AIRFLOW__", "MAKE", "MFLAGS")) and k != "PYTHONPATH"}
        env.update({"BERTFLOW_ARTIFACT_ROOT": str(self.artifact_root), **TEST_SERVER_ENV,
                    **self.extra_env})
        return env

    def start(self, timeout: float = 420) -> None:
        self.proc = subprocess.Popen(
            ["make", "--no-print-directory", "airflow", f"PORT={self.port}",
             f"AIRFLOW_HOME={self.home}"], cwd=PROJECT_ROOT, env=self.env(),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
            preexec_fn=_as_from_a_terminal)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.wait_for_line(re.compile(re.escape(f"Airflow is up: {self.base}")), timeout)
        self.user, self.password = self.wait_for_line(self.LOGIN, timeout=10).groups()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, pattern: re.Pattern, timeout: float, after: int = 0) -> re.Match:
        """The first line matching `pattern` among those printed after the first `after`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines[after:]:
                if match := pattern.search(line):
                    return match
            if self.proc.poll() is not None:
                raise RuntimeError(f"make airflow exited with {self.proc.returncode}:\n"
                                   + self.output)
            time.sleep(0.2)
        raise TimeoutError(f"no line matching {pattern.pattern!r} after {timeout:.0f}s:\n"
                           + self.output)

    def _group_states(self) -> str:
        """State and signal masks of every process in make's process group."""
        out = []
        for entry in Path("/proc").iterdir():
            try:
                if not entry.name.isdigit() or os.getpgid(int(entry.name)) != self.proc.pid:
                    continue
                status = {k: v.strip() for k, v in (line.split(":", 1) for line in
                          (entry / "status").read_text().splitlines() if ":" in line)}
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ")[:120].decode(errors="replace")
                wchan = (entry / "wchan").read_text()
            except OSError:  # ended meanwhile (ProcessLookupError is one)
                continue
            out.append(f"{entry.name} {cmd!r} state={status.get('State')} wchan={wchan} "
                       + " ".join(f"{k}={status.get(k)}" for k in
                                  ("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")))
        return "\n".join(out)

    def interrupt(self, timeout: float = 120) -> int:
        """Stopping is bounded (bertflow_airflow.demo._stop_standalone: about 50 s); on a timeout, say
        what make printed, and its processes' states and signal masks."""
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"make airflow still running {timeout:.0f}s after Ctrl-C:\n"
                                 + self.output + "\n" + self._group_states()) from None
        self._reader.join(timeout=10)
        return rc

    def log_tail(self, lines: int = 80) -> str:
        return "---- make airflow output ----\n" + self.output + "\n" + super().log_tail(lines)


# --- Chromium ---------------------------------------------------------------------------

class Browser:
    """Headless Chromium driven through the DevTools protocol over one page websocket."""

    def __init__(self):
        self.profile = tempfile.mkdtemp(prefix="bertflow-chromium-")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}",
             f"--remote-debugging-port={self.port}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self._id = 0
        self.ws = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                pages = [t for t in httpx.get(f"http://127.0.0.1:{self.port}/json/list",
                                              timeout=5).json() if t["type"] == "page"]
                if pages:
                    break
            except (httpx.HTTPError, ValueError):
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}")
            time.sleep(0.5)
        else:
            self.close()
            raise RuntimeError("chromium DevTools endpoint did not come up")
        from websockets.sync.client import connect

        self._stack = contextlib.ExitStack()
        self.ws = self._stack.enter_context(connect(
            pages[0]["webSocketDebuggerUrl"], max_size=64 * 2**20, open_timeout=30))
        self.send("Page.enable")
        self.send("Network.enable")

    def send(self, method: str, timeout: float = 60, **params) -> dict:
        self._id += 1
        msg_id = self._id
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def evaluate(self, expression: str):
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"JS error: {result['exceptionDetails']}")
        return result["result"].get("value")

    # DevTools' answers to an evaluation that a navigation (a click on a link, say) cut
    # short or that reached the page between two documents: the expression is asked again.
    NAVIGATING = ("Inspected target navigated or closed", "Execution context was destroyed",
                  "Cannot find context with specified id")

    def wait_js(self, expression: str, timeout: float = 90, interval: float = 0.5):
        """Poll a JS expression until truthy; returns its value."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = self.evaluate(expression)
            except RuntimeError as err:
                if not any(message in str(err) for message in self.NAVIGATING):
                    raise
                last = None
            if last:
                return last
            time.sleep(interval)
        body = str(self.evaluate("document.body && document.body.innerText"))[:1500]
        raise TimeoutError(f"browser: {expression!r} still falsy after {timeout:.0f}s "
                           f"(url {self.evaluate('location.href')}, body text: {body!r})")

    def click(self, element_js: str) -> None:
        """A real mouse click (pressed + released at the element's centre), for widgets
        that ignore a scripted element.click()."""
        x, y = self.evaluate(f"""(() => {{ const el = {element_js};
            el.scrollIntoView({{block: 'center'}}); const r = el.getBoundingClientRect();
            return [r.x + r.width / 2, r.y + r.height / 2]; }})()""")
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left",
                      clickCount=1)

    def set_cookie(self, name: str, value: str, url: str) -> None:
        assert self.send("Network.setCookie", name=name, value=value, url=url)["success"]

    def navigate(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png", timeout=120)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            if self.ws is not None:
                self._stack.close()
        finally:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)
            shutil.rmtree(self.profile, ignore_errors=True)
