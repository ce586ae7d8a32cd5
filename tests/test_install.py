"""bertflow is an installed project (pyproject.toml; `make install` installs it editable): any
process of the venv imports `tasks` and `bertflow_airflow`, whatever its working directory and
without PYTHONPATH, and a wheel built from the project carries what the packages need beside
their .py files (the CPU kernels' sources).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = "import json, tasks, bertflow_airflow; print(json.dumps([tasks.__file__, " \
        "bertflow_airflow.__file__]))"


def test_the_venv_imports_this_checkout_from_anywhere(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    tasks_file, airflow_side = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(tasks_file) == ROOT / "tasks" / "__init__.py"
    assert Path(airflow_side) == ROOT / "bertflow_airflow" / "__init__.py"


def test_the_installed_distribution_is_this_project():
    import importlib.metadata

    import tasks

    dist = importlib.metadata.distribution("bertflow")
    assert dist.version == tasks.__version__
    # Its dependencies are requirements.in's (the lock, requirements.txt, pins them).
    from packaging.requirements import Requirement

    lines = [line.split("#")[0].strip() for line in
             (ROOT / "requirements.in").read_text().splitlines()]
    assert sorted(Requirement(r).name.lower() for r in dist.requires) == sorted(
        Requirement(line).name.lower() for line in lines if line)


def test_a_wheel_holds_the_packages_and_the_kernel_sources(tmp_path):
    """Built from a copy (the checkout stays clean) with the venv's setuptools, offline."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "requirements.in"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "build", "*.so")
    for package in ("tasks", "bertflow_airflow"):
        shutil.copytree(ROOT / package, src / package, ignore=ignore)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-q", "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("bertflow-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    kernels = {n for n in names if n.startswith("tasks/model/cpu_kernels/")}
    sources = {p.name for p in (ROOT / "tasks/model/cpu_kernels").iterdir()
               if p.suffix in (".cc", ".h", ".py")}
    assert {Path(n).name for n in kernels} == sources
    assert "bertflow_airflow/worker_operator.py" in names and "tasks/__main__.py" in names
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"tasks", "bertflow_airflow"}


def test_the_airflow_image_installs_the_project_as_make_install_does():
    """docker/Dockerfile.airflow (not built here: no docker): it copies what pyproject.toml
    reads (README.md, requirements.in) beside the packages and installs them editable, with no
    PYTHONPATH; the DAGs and the plugin then import the installed packages."""
    import re

    text = re.sub(r"\\\n\s*", " ", (ROOT / "docker" / "Dockerfile.airflow").read_text())
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    copied = " ".join(line for line in lines if line.startswith("COPY "))
    for name in ("pyproject.toml", "README.md", "requirements.in", "tasks/",
                 "bertflow_airflow/", "dags/", "plugins/", "examples/"):
        assert f" {name}" in copied, name
    install = [line for line in lines if "pip install" in line and " -e " in line]
    assert install and "--no-deps" in install[0] and "/opt/bertflow" in install[0]
    assert "PYTHONPATH" not in "\n".join(lines)
