"""A test-only PyTorch environment, .venv-torch/: the torch 2.13.0 CPU wheel from disk plus
transformers, safetensors, tokenizers and numpy at the project lock's pins, and no
TensorFlow. It checks that exported versions load in PyTorch transformers as users load them.

Built once and kept while its pins are unchanged (a stamp file), as .venv-tf220 is. The wheel
is looked up in $BERTFLOW_TORCH_WHEELS (default /opt/wheels, where this machine keeps it): PyPI's
Linux torch is the CUDA build, gigabytes of it.
Runnable as a script to build it ahead of the tests: `python tests/torch_env.py`.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-torch"
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
    """.venv-torch's interpreter, built if missing or stale."""
    wheel = torch_wheel()
    pins = _pins()
    requirements = [str(wheel)] + [f"{name}=={pins[name]}" for name in FROM_LOCK]
    stamp_text = hashlib.sha256(" ".join(requirements).encode()).hexdigest()
    interpreter, stamp = VENV / "bin" / "python", VENV / ".bertflow-torch"
    if stamp.is_file() and stamp.read_text() == stamp_text and interpreter.exists():
        return interpreter
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
    done = subprocess.run([str(interpreter), "-m", "pip", "install", "--quiet",
                           "--only-binary=:all:", *requirements],
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"installing {requirements} into {VENV} failed:\n"
                           f"{done.stdout[-2000:]}{done.stderr[-3000:]}")
    stamp.write_text(stamp_text)
    return interpreter


# PyTorch transformers only: no TensorFlow (checked), no project.
_PREDICT = """
import json, sys
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
try:
    import tensorflow  # noqa: F401
    sys.exit("tensorflow is importable in the torch environment")
except ImportError:
    pass
folder, texts = sys.argv[1], json.loads(sys.argv[2])
model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
tokenizer = AutoTokenizer.from_pretrained(folder)
batch = tokenizer(texts, padding=True, return_tensors="pt")
with torch.no_grad():
    probabilities = torch.softmax(model(**batch).logits, dim=-1)
print(json.dumps({"probabilities": probabilities.tolist(), "id2label": model.config.id2label,
                  "tokenizer": type(tokenizer).__name__}))
"""


def predict(folder: str, texts: list[str]) -> dict:
    """`{"probabilities", "id2label", "tokenizer"}` from AutoModelForSequenceClassification and
    AutoTokenizer loading `folder` in .venv-torch."""
    with tempfile.TemporaryDirectory() as cwd:  # so `tasks` is not importable there
        done = subprocess.run([str(python()), "-c", _PREDICT, str(folder), json.dumps(texts)],
                              capture_output=True, text=True, timeout=600, cwd=cwd,
                              env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    if done.returncode:
        raise AssertionError(f"PyTorch could not load {folder}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(python())
