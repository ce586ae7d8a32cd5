"""A SavedModel's serving signature run in a new interpreter that imports only TensorFlow
and tensorflow-text (for the tokenizer's ops), outside the project: what a user's server
does with an exported model. The export step checks every version this way
(tasks/steps/export.py); the demo prints its predictions from it (bertflow_airflow/demo.py).

The interpreter reads one JSON line on stdin, `[saved_model_path, {input: [strings]}]`, and
prints one: every output of the signature, strings decoded and numbers as floats.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

SCRIPT = """
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  registers the tokenizer ops the graph uses
path, inputs = json.loads(sys.stdin.readline())
serve = tf.saved_model.load(path).signatures["serving_default"]
out = serve(**{k: tf.constant(v) for k, v in inputs.items()})
import numpy as np
print(json.dumps({k: (np.char.decode(v.numpy().astype("S"), "utf-8") if v.dtype == tf.string
                      else v.numpy().astype(float)).tolist() for k, v in out.items()}))
"""


def command() -> list[str]:
    return [sys.executable, "-c", SCRIPT]


def environment() -> dict[str, str]:
    """This process's environment less PYTHONPATH (with the cwd outside the checkout,
    `tasks` is not importable), TensorFlow's start-up notices off."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def request(saved_model: str, inputs: dict[str, list[str]]) -> str:
    return json.dumps([saved_model, inputs]) + "\n"


def parse(stdout: str) -> dict[str, list]:
    return json.loads(stdout.strip().splitlines()[-1])


def predict(saved_model: str, inputs: dict[str, list[str]]) -> dict[str, list]:
    """Start the interpreter, run the signature once on `inputs`, return its outputs."""
    with tempfile.TemporaryDirectory(prefix="bertflow-fresh-load-") as cwd:
        done = subprocess.run(command(), input=request(saved_model, inputs), cwd=cwd,
                              env=environment(), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"loading the SavedModel {saved_model} in a fresh interpreter "
                           f"failed:\n{done.stderr[-3000:]}")
    return parse(done.stdout)
