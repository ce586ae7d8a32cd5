"""A test-only PyTorch environment: the torch 2.13.0 CPU wheel from disk plus
transformers, safetensors, tokenizers and numpy at the project lock's pins, and no
TensorFlow. It checks that exported versions load in PyTorch transformers as users load them.

Built once per set of pins and kept outside the checkout (tests/env_cache.py), as the TPU
lock's environment is. The wheel is looked up in $BERTFLOW_TORCH_WHEELS (default /opt/wheels,
where this machine keeps it): PyPI's Linux torch is the CUDA build, gigabytes of it.
Runnable as a script to build it ahead of the tests: `python tests/torch_env.py`.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import env_cache

ROOT = Path(__file__).resolve().parent.parent
TORCH = "2.13.0"
FROM_LOCK = ("transformers", "safetensors", "tokenizers", "huggingface_hub", "numpy")


class Unavailable(Exception):
    """The torch CPU wheel is not on this machine."""


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep:
            pins[name.strip().lower().replace("-", "_")] = version.split(";")[0].strip()
    return pins


def torch_wheel() -> Path:
    folder = Path(os.environ.get("BERTFLOW_TORCH_WHEELS", "/opt/wheels"))
    found = sorted(folder.glob(f"torch-{TORCH}+cpu-cp311-*.whl"))
    if not found:
        raise Unavailable(f"no torch {TORCH} CPU wheel in {folder} (set "
                          f"BERTFLOW_TORCH_WHEELS to a folder holding "
                          f"torch-{TORCH}+cpu-cp311-*.whl)")
    return found[-1]


def python() -> Path:
    """The torch environment's interpreter, built if missing (tests/env_cache.py)."""
    wheel = torch_wheel()
    pins = _pins()
    requirements = [str(wheel)] + [f"{name}=={pins[name]}" for name in FROM_LOCK]

    def install(interpreter: Path) -> None:
        done = subprocess.run([str(interpreter), "-m", "pip", "install", "--quiet",
                               "--only-binary=:all:", *requirements],
                              capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"installing {requirements} into {interpreter.parent.parent} "
                               f"failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")

    return env_cache.venv("torch", " ".join(requirements), install)


# PyTorch transformers only: no TensorFlow (checked), no project. One interpreter per test
# process serves every request (a JSON line in, one out): torch and transformers import once
# (~3 s of CPU each time otherwise), while each request loads its folder afresh.
_SERVE = """
import json, sys, traceback
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
try:
    import tensorflow  # noqa: F401
    sys.exit("tensorflow is importable in the torch environment")
except ImportError:
    pass


def predict(folder, texts):
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    # Cut at the export's model_max_length, as the SavedModel cuts at max_seq_length.
    batch = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
    # The task's output, by config.json's problem_type as transformers reads it: softmax for
    # one label, sigmoid per label for several, the raw score for regression.
    problem = model.config.problem_type
    outputs = {"multi_label_classification": torch.sigmoid(logits),
               "regression": logits[:, 0]}.get(problem, torch.softmax(logits, dim=-1))
    return {"probabilities": outputs.tolist(), "id2label": model.config.id2label,
            "problem_type": problem, "tokenizer": type(tokenizer).__name__}


def ner(folder, texts):
    # transformers' own entity grouping, for the exported token classification models.
    from transformers import pipeline

    ner = pipeline("ner", model=folder, tokenizer=folder, aggregation_strategy="first",
                   device="cpu")
    return [[{k: (float(v) if k == "score" else v) for k, v in entity.items()}
             for entity in ner(text)] for text in texts]


replies, sys.stdout = sys.stdout, sys.stderr  # what the libraries print stays off the replies
for line in sys.stdin:
    request = json.loads(line)
    try:
        reply = {"result": {"predict": predict, "ner": ner}[request["kind"]](
            request["folder"], request["texts"])}
    except Exception:
        reply = {"error": traceback.format_exc()}
    print(json.dumps(reply), file=replies, flush=True)
"""

_server: dict = {}


def _request(kind: str, folder: str, texts: list[str]):
    proc = _server.get("proc")
    if proc is None or proc.poll() is not None:
        cwd = tempfile.mkdtemp(prefix="torch-env-")  # so `tasks` is not importable there
        log = open(Path(cwd) / "stderr.log", "w+")
        proc = subprocess.Popen([str(python()), "-c", _SERVE], cwd=cwd, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                env={k: v for k, v in os.environ.items()
                                     if k != "PYTHONPATH"})
        _server.update(proc=proc, log=log, cwd=cwd)
        atexit.register(_stop, proc, cwd)
    proc.stdin.write(json.dumps({"kind": kind, "folder": str(folder), "texts": texts}) + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        proc.wait()
        _server["log"].seek(0)
        raise AssertionError(f"the torch environment exited {proc.returncode}:\n"
                             f"{_server['log'].read()[-3000:]}")
    reply = json.loads(line)
    if "error" in reply:
        raise AssertionError(f"PyTorch could not load {folder}:\n{reply['error'][-3000:]}")
    return reply["result"]


def _stop(proc: subprocess.Popen, cwd: str) -> None:
    proc.stdin.close()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
    shutil.rmtree(cwd, ignore_errors=True)


def ner(folder: str, texts: list[str]) -> list[list[dict]]:
    """pipeline("ner", aggregation_strategy="first") over `texts` with the Hugging Face
    checkpoint in `folder`: per text its entities (entity_group, score, word, start, end)."""
    return _request("ner", folder, texts)


def predict(folder: str, texts: list[str]) -> dict:
    """`{"probabilities", "id2label", "problem_type", "tokenizer"}` from
    AutoModelForSequenceClassification and AutoTokenizer loading `folder` in the torch
    environment; "probabilities" holds the task's output (softmax, sigmoid, or the score for
    regression)."""
    return _request("predict", folder, texts)


if __name__ == "__main__":
    print(python())
