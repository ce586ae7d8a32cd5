"""Worker images: each is built from its own lock (docker/), labelled and named with the project
version, so a backend's default image always matches the code that rendered its spec."""
from __future__ import annotations

from tasks import __version__

# accelerator kind -> the lock its image installs (see docker/Dockerfile.trainer-KIND)
KINDS = ("cpu", "gpu", "tpu")
# Paths from the project root. `make locks` rewrites the locks (docker/locks/resolve.py);
# tests/test_images.py checks that each still resolves on PyPI. CPU and GPU: TensorFlow 2.21
# (GPU with the CUDA wheels of tensorflow[and-cuda]); TPU: tensorflow-tpu 2.20, the newest.
LOCKS = {kind: f"docker/locks/trainer-{kind}.txt" for kind in KINDS}
DOCKERFILES = {kind: f"docker/Dockerfile.trainer-{kind}" for kind in KINDS}


def default_image(kind: str, registry: str = "") -> str:
    """`{registry}/bertflow-trainer-{kind}:{version}`; no registry: a local image name."""
    if kind not in KINDS:
        raise ValueError(f"no trainer image for {kind!r}; expected one of {KINDS}")
    name = f"bertflow-trainer-{kind}:{__version__}"
    return f"{registry.rstrip('/')}/{name}" if registry else name


def image_kind(accelerator: str, accelerator_type: str = "") -> str:
    """Which trainer image a worker needs: tpu and gpu by the accelerator Param (or a
    TPU/GPU accelerator_type), else cpu."""
    kind = accelerator_type.lower()
    if accelerator == "tpu" or kind.startswith(("tpu", "v2", "v3", "v4", "v5", "v6")):
        return "tpu"
    if accelerator == "gpu" or kind.startswith("nvidia"):
        return "gpu"
    return "cpu"
