"""bertflow pipeline steps as plain Python (no Airflow imports).

Run any step as `python -m tasks <step> --run-dir URI`; the DAG, a worker pod, a TPU VM and the
tests all call the same code.
"""
import os
import platform

# bertflow's model is built on Keras 2 (tf-keras: ParameterServer training and the legacy
# optimizers it needs); this must be set before tensorflow is first imported, in every process.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
# TensorFlow turns on its oneDNN CPU kernels by itself only on CPUs with avx512_vnni,
# avx512_bf16 or AMX. Without them, on an AVX2-only CPU, float32 training ran 1.86x slower
# (computed from the archived benchmarks/results/archive/train_throughput_avx2.json,
# summary.bertflow_onednn over summary.bertflow). Set TF_ENABLE_ONEDNN_OPTS=0 to opt out.
if platform.machine().lower() in ("x86_64", "amd64"):
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

# The project version: trainer images are labelled and named with it (tasks/provision/images.py).
__version__ = "0.5.0"
