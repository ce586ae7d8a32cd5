"""A throwaway PostgreSQL cluster on a loopback port, for tests that need a real metadata
database (tests/test_scheduler_postgres.py).

Uses Debian's `postgresql` package (`make test-deps` installs it). Root cannot run postgres,
so as root the data folder belongs to the `postgres` user and initdb / postgres run as it.
The server is a direct child in its own process group (no pg_ctl daemon), so `stop()` can
always reach it and its backends: SIGINT (fast shutdown), then SIGKILL to the group.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from ui_helpers import free_port

DB_USER = "airflow"
DB_NAME = "airflow"


def postgres_bin_dir() -> Path | None:
    """The newest /usr/lib/postgresql/N/bin with initdb and postgres, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"),
                   key=lambda p: int(Path(p).parent.parent.name)
                   if Path(p).parent.parent.name.isdigit() else 0)
    for path in reversed(found):
        bin_dir = Path(path).parent
        if (bin_dir / "initdb").exists():
            return bin_dir
    return None


class PostgresServer:
    def __init__(self):
        self.bin_dir = postgres_bin_dir()
        if self.bin_dir is None:
            raise RuntimeError("PostgreSQL server binaries not found under /usr/lib/postgresql: "
                               "run `make test-deps` (apt-get install -y postgresql)")
        self.port = free_port()
        # Not under pytest's tmp folders: those are 0700 root, and the server runs as postgres.
        self.base = Path(tempfile.mkdtemp(prefix="bertflow-pg-"))
        self.data = self.base / "data"
        self.log_path = self.base / "postgres.log"
        self.proc: subprocess.Popen | None = None
        self._user: dict = {}
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            self._user = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
            os.chown(self.base, pw.pw_uid, pw.pw_gid)
        os.chmod(self.base, 0o700)

    @property
    def url(self) -> str:
        """SQLAlchemy URL for Airflow (psycopg2; Airflow derives asyncpg for its async engine)."""
        return f"postgresql+psycopg2://{DB_USER}@127.0.0.1:{self.port}/{DB_NAME}"

    def _run(self, *args: str) -> None:
        done = subprocess.run([str(self.bin_dir / args[0]), *args[1:]], capture_output=True,
                              text=True, cwd=self.base, **self._user)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n"
                               f"{done.stdout[-2000:]}{done.stderr[-2000:]}")

    def start(self, timeout: float = 60) -> None:
        # Trust on loopback only: a throwaway cluster in a 0700 folder, gone after the test.
        self._run("initdb", "-D", str(self.data), "-U", DB_USER, "--auth=trust", "-E", "UTF8",
                  "--no-sync", "--no-instructions")
        log = open(self.log_path, "wb")
        if self._user:
            os.chown(self.log_path, self._user["user"], self._user["group"])
        self.proc = subprocess.Popen(
            [str(self.bin_dir / "postgres"), "-D", str(self.data), "-p", str(self.port),
             "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.base}",
             "-c", "max_connections=200",
             # Durability is pointless for a throwaway cluster; speed is not.
             "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
            stdout=log, stderr=subprocess.STDOUT, cwd=self.base, start_new_session=True,
            **self._user)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {self.proc.returncode}:\n"
                                   + self.log_tail())
            ready = subprocess.run([str(self.bin_dir / "pg_isready"), "-h", "127.0.0.1",
                                    "-p", str(self.port), "-U", DB_USER, "-d", "postgres"],
                                   capture_output=True)
            if ready.returncode == 0:
                break
            time.sleep(0.3)
        else:
            raise RuntimeError(f"postgres not ready after {timeout:.0f}s\n" + self.log_tail())
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", DB_USER, DB_NAME)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no postgres log)"
        return "---- postgres log (tail) ----\n" + "\n".join(text[-lines:])

    def pids(self) -> list[int]:
        """Processes of this server still alive (postmaster and backends share its group)."""
        if self.proc is None:
            return []
        out = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.getpgid(int(entry.name)) == self.proc.pid:
                        out.append(int(entry.name))
                except (ProcessLookupError, PermissionError):
                    pass
        return out

    def stop(self) -> list[int]:
        """Fast shutdown, then SIGKILL the group; removes the cluster. Returns survivors."""
        survivors: list[int] = []
        if self.proc is not None:
            if self.proc.poll() is None:
                try:
                    self.proc.send_signal(signal.SIGINT)  # fast shutdown
                    self.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if self.proc.poll() is None:
                self.proc.wait(timeout=10)
            deadline = time.monotonic() + 5
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.2)
            survivors = self.pids()
        shutil.rmtree(self.base, ignore_errors=True)
        return survivors
