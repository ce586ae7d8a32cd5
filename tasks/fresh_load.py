"""A SavedModel's serving signature run in a new interpreter that imports only TensorFlow
and tensorflow-text (for the tokenizer's ops), outside the project: what a user's server
does with an exported model. The export step checks every version this way
(tasks/steps/export.py); the demo prints its predictions from it (bertflow_airflow/demo.py).

The interpreter reads one JSON line on stdin, `[saved_model_path, {input: [strings]}]`, and
prints one: every output of the signature, strings decoded and numbers as floats. Where a
warm-start server runs ($BERTFLOW_WARM_SOCKET), the export forks it from that server's clean
companion, which imported these two modules and nothing of bertflow
(tasks/provision/local/warm_start.py, start_fresh_load); elsewhere it is a new interpreter.
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


def popen(cwd: str, stdout, stderr) -> subprocess.Popen:
    """The interpreter as a new process, writing to the open files `stdout` and `stderr`, in
    `cwd` (a folder outside the checkout); write the request to its `stdin` and close it.
    tasks/provision/local/warm_start.py's start_fresh_load forks it where a server runs."""
    return subprocess.Popen(command(), cwd=cwd, env=environment(), stdin=subprocess.PIPE,
                            stdout=stdout, stderr=stderr, text=True)


def predict(saved_model: str, inputs: dict[str, list[str]], start=popen) -> dict[str, list]:
    """Start the interpreter (`start`: popen, or warm_start.start_fresh_load), run the
    signature once on `inputs`, return its outputs."""
    with tempfile.TemporaryDirectory(prefix="bertflow-fresh-load-") as cwd:
        out_path, err_path = os.path.join(cwd, "stdout"), os.path.join(cwd, "stderr")
        with open(out_path, "w") as out, open(err_path, "w") as err:
            proc = start(cwd, out, err)
        with proc.stdin:
            proc.stdin.write(request(saved_model, inputs))
        code = proc.wait()
        with open(out_path) as out, open(err_path) as err:
            stdout, stderr = out.read(), err.read()
    if code != 0:
        raise RuntimeError(f"loading the SavedModel {saved_model} in a fresh interpreter "
                           f"failed:\n{stderr[-3000:]}")
    return parse(stdout)
