"""What the Cloud TPU VM backend asks for, as data: the run's names and labels, the queued
resource with its node and startup script, and the step requests the agent on the VM runs.
Touches no cloud (the dry run prints these)."""
from __future__ import annotations

import re
import shlex
import time

from tasks.config import RunConfig
from tasks.io.uris import join_uri
from tasks.errors import ConfigError
from tasks.io import credentials
from tasks.provision import capacity, images
from tasks.provision.backends import google_label_value
from tasks.provision.spec import WorkerSpec
from tasks.provision.spec import run_hash as spec_run_hash
from tasks.runs.runlayout import RunContext

TF_VERSION = "2.20.0"  # the TPU image's lock (tensorflow-tpu stops at 2.20)
# Single-host runtimes by TPU generation (the accelerator type's prefix): the base images of
# Cloud TPU's "TPU software versions" page (cloud.google.com/tpu/docs/runtimes: v6e
# v2-alpha-tpuv6e, v5p v2-alpha-tpuv5, v5e v2-alpha-tpuv5-lite, v4 and older
# tpu-ubuntu2204-base), which "Run TPU workloads in a Docker container" starts from: the
# container brings the framework. The page's TensorFlow runtimes (tpu-vm-tf-x.y.z[-pod]
# [-pjrt]) stop before 2.20, the TPU image's TensorFlow.
BASE_RUNTIMES = {"v2": "tpu-ubuntu2204-base", "v3": "tpu-ubuntu2204-base",
                 "v4": "tpu-ubuntu2204-base", "v5litepod": "v2-alpha-tpuv5-lite",
                 "v5e": "v2-alpha-tpuv5-lite", "v5p": "v2-alpha-tpuv5",
                 "v6e": "v2-alpha-tpuv6e"}
POD_RUNTIME_EXAMPLE = f"tpu-vm-tf-{TF_VERSION}-pod-pjrt"
# Multi-host TensorFlow (GoogleCloudPlatform/ml-auto-solutions, dags/solutions_team/configs/
# tensorflow/common.py, export_env_variables): a pod run sets TPU_LOAD_LIBRARY=0 (the slice's
# hosts serve the chips) and not the PJRT plug-in the image sets for single hosts;
# tensorflow-tpu 2.20 loads TF_PLUGGABLE_DEVICE_LIBRARY_PATH only when it is not empty.
POD_ENV = {"TPU_LOAD_LIBRARY": "0", "NEXT_PLUGGABLE_DEVICE_USE_C_API": "false",
           "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": ""}
HOST_CHIPS = 8  # the number in an accelerator type up to which a slice is one host
MANAGED_BY = "bertflow"
LABEL_RUN, LABEL_DAG, LABEL_EXPIRES = "bertflow-run", "bertflow-dag", "bertflow-expires"
_ACCELERATOR = re.compile(r"^(v\d+[a-z]*)-(\d+)$")  # v4-8, v5p-16, v5litepod-8, v6e-16
TPU_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,47}[a-z0-9])?$")


def is_multi_host(accelerator_type: str) -> bool:
    match = _ACCELERATOR.match(accelerator_type)
    if not match:
        raise ConfigError("accelerator_type", f"{accelerator_type!r} is not a Cloud TPU type "
                                              "such as v4-8, v5litepod-8 or v6e-16")
    return int(match.group(2)) > HOST_CHIPS


def runtime_version(cfg: RunConfig) -> str:
    """tpu_runtime_version, else the base runtime of a single host's TPU generation."""
    if cfg.tpu_runtime_version:
        return cfg.tpu_runtime_version
    if is_multi_host(cfg.accelerator_type):
        raise ConfigError("tpu_runtime_version", (
            f"{cfg.accelerator_type} spans several hosts: TensorFlow on a multi-host slice "
            f"needs the TensorFlow pod runtime of the image's TensorFlow {TF_VERSION} (named "
            f"like {POD_RUNTIME_EXAMPLE}), which Google's \"TPU software versions\" page does "
            f"not list; set tpu_runtime_version to a -pod- runtime that `gcloud compute tpus "
            f"versions list --zone {cfg.tpu_zone or 'ZONE'}` shows"))
    generation = _ACCELERATOR.match(cfg.accelerator_type).group(1)
    if generation not in BASE_RUNTIMES:
        raise ConfigError("tpu_runtime_version", (
            f"no default runtime for TPU generation {generation}: set tpu_runtime_version "
            f"(known generations: {', '.join(BASE_RUNTIMES)})"))
    return BASE_RUNTIMES[generation]


def run_hash(ctx: RunContext) -> str:
    return spec_run_hash(ctx.run_uri, 12)


def resource_id(cfg: RunConfig, ctx: RunContext) -> str:
    """The queued resource's and node's id: the TPU name for a multi-host slice (the worker
    connects by it), else one per run."""
    if is_multi_host(cfg.accelerator_type):
        return cfg.tpu_address
    return f"bertflow-{run_hash(ctx)}"


def tpu_names(cfg: RunConfig, ctx: RunContext, project: str) -> tuple[str, str]:
    """The full names of the run's queued resource and of its node."""
    parent, rid = f"projects/{project}/locations/{cfg.tpu_zone}", resource_id(cfg, ctx)
    return f"{parent}/queuedResources/{rid}", f"{parent}/nodes/{rid}"


def agent_uri(ctx: RunContext, *parts: str) -> str:
    """Where controller and agent meet in the run folder."""
    return join_uri(ctx.step_uri("provision"), "tpu_vm", *parts)


def expiry(cfg: RunConfig, now: float | None = None) -> str:
    """The expiry label's value: the queue's patience plus the workers' lifetime from now,
    after which a sweep removes the TPU even if no teardown ran. A step controller renews it
    on the node while its step runs (TpuStepController, TpuVmBackend.renew_expiry)."""
    now = time.time() if now is None else now
    return str(int(now + cfg.schedule_timeout_seconds + cfg.worker_timeout_minutes * 60))


def labels(cfg: RunConfig, ctx: RunContext, now: float | None = None) -> dict[str, str]:
    expires = expiry(cfg, now)
    return {"managed-by": MANAGED_BY, LABEL_RUN: run_hash(ctx),
            LABEL_DAG: google_label_value(ctx.dag_id), LABEL_EXPIRES: expires}


def worker_image(cfg: RunConfig) -> str:
    return cfg.worker_image or images.default_image("tpu", cfg.image_registry)


# The startup script's patience: Docker's daemon may start after the script (attempts x
# seconds), an image pull may fail on a registry hiccup (attempts, waits doubling from
# PULL_FIRST_WAIT), the metadata server may not answer at once (curl --retry).
DOCKER_WAIT = (60, 5)
PULL_ATTEMPTS, PULL_FIRST_WAIT = 6, 5
METADATA_RETRIES = 10
# Where each stage is written: the journal (logger -t; `sudo journalctl -t bertflow-startup`
# on the VM) and the serial console, /dev/ttyS0, which is serial port 1, the one `gcloud
# compute instances get-serial-port-output` returns by default ("Instances can support up to
# four serial port outputs, numbered 1 through 4", gcloud reference).
STARTUP_TAG = "bertflow-startup"
CONSOLE = "/dev/ttyS0"
METADATA_URL = ("http://metadata.google.internal/computeMetadata/v1/instance/attributes/"
                "agent-worker-number")


def startup_script(cfg: RunConfig, ctx: RunContext) -> str:
    """Runs at every boot of every host: worker 0 starts the agent in the TPU trainer image.
    Holds no secret: the container reaches gs:// as the VM's service account. Each stage is
    logged to the journal and the serial console; a stage that fails ends the script non-zero
    with its reason there."""
    image = shlex.quote(worker_image(cfg))
    registry = worker_image(cfg).split("/", 1)[0] if "/" in worker_image(cfg) else ""
    login = (f"say {shlex.quote(f'configuring docker for {registry}')}\n"
             f"gcloud auth configure-docker {shlex.quote(registry)} --quiet || "
             f"fail {shlex.quote(f'gcloud auth configure-docker {registry} failed')}\n"
             if registry.endswith(("-docker.pkg.dev", "gcr.io")) else "")
    agent = ["python", "-m", "tasks.provision.tpu_vm.agent", "--run-dir", ctx.run_uri]
    tries, pause = DOCKER_WAIT
    return (
        "#!/bin/bash\n"
        f"# bertflow TPU VM agent for run {ctx.run_uri} (tasks/provision/tpu_vm/agent.py)\n"
        "say() {\n"
        f"  logger -t {STARTUP_TAG} -- \"$*\" 2>/dev/null\n"
        f"  [ -w {CONSOLE} ] && echo \"{STARTUP_TAG}: $*\" >> {CONSOLE} 2>/dev/null\n"
        "  echo \"$*\"\n"
        "}\n"
        "fail() { say \"FAILED: $*\"; exit 1; }\n"
        "say 'reading the worker number of this host from the metadata server'\n"
        f"worker=$(curl -fsS --retry {METADATA_RETRIES} --retry-connrefused --retry-delay 2 "
        f"--max-time 10 -H 'Metadata-Flavor: Google' {METADATA_URL}) || "
        "fail 'the metadata server did not answer agent-worker-number'\n"
        'if [ "$worker" != "0" ]; then say "host $worker: the TF worker runs on host 0"; '
        "exit 0; fi\n"
        "say 'waiting for docker'\n"
        "ready=\n"
        f"for i in $(seq 1 {tries}); do docker info >/dev/null 2>&1 && ready=1 && break; "
        f"sleep {pause}; done\n"
        f'[ -n "$ready" ] || fail "docker did not answer within {tries * pause}s"\n'
        f"{login}"
        f"say {shlex.quote('pulling ' + worker_image(cfg))}\n"
        f"pause={PULL_FIRST_WAIT}; pulled=\n"
        f"for i in $(seq 1 {PULL_ATTEMPTS}); do\n"
        f"  docker pull {image} && pulled=1 && break\n"
        f'  say "pull attempt $i of {PULL_ATTEMPTS} failed; retrying in ${{pause}}s"\n'
        "  sleep $pause; pause=$((pause * 2))\n"
        "done\n"
        f'[ -n "$pulled" ] || fail '
        f"{shlex.quote(f'could not pull {worker_image(cfg)} after {PULL_ATTEMPTS} attempts')}\n"
        "say 'starting the agent'\n"
        "docker rm -f bertflow-agent >/dev/null 2>&1\n"
        "docker run -d --restart=on-failure:5 --name bertflow-agent --privileged --net=host "
        "-e TF_USE_LEGACY_KERAS=1 -e PYTHONUNBUFFERED=1 "
        f"--entrypoint python {image} {shlex.join(agent[1:])} || "
        "fail 'docker run of the agent failed'\n"
        "say 'agent started'\n")


def queued_resource(cfg: RunConfig, ctx: RunContext, project: str, now: float | None = None):
    """The QueuedResource (google.cloud.tpu_v2) this run creates."""
    from google.cloud import tpu_v2

    parent = f"projects/{project}/locations/{cfg.tpu_zone}"
    node = tpu_v2.Node(
        accelerator_type=cfg.accelerator_type, runtime_version=runtime_version(cfg),
        description=f"bertflow run {ctx.run_uri}", labels=labels(cfg, ctx, now),
        metadata={"startup-script": startup_script(cfg, ctx)},
        # NetworkConfig.enable_external_ips (Cloud TPU API): "If set to false, the specified
        # subnetwork or network should have Private Google Access enabled" (tpu_external_ips).
        network_config=tpu_v2.NetworkConfig(network=cfg.network,
                                             enable_external_ips=cfg.tpu_external_ips))
    if cfg.service_account:
        node.service_account = tpu_v2.ServiceAccount(
            email=cfg.service_account, scope=["https://www.googleapis.com/auth/cloud-platform"])
    resource = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[
        tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent, node_id=resource_id(cfg, ctx),
                                           node=node)]))
    resource.queueing_policy.valid_until_duration = {"seconds": int(cfg.schedule_timeout_seconds)}
    # QueuedResource tier (tpu_v2): `spot` is the Spot tier; a reservation is named by
    # reservation_name; on_demand leaves both unset (the API's default tier).
    if cfg.capacity == "spot":
        resource.spot = tpu_v2.QueuedResource.Spot()
    elif cfg.capacity == "reservation":
        resource.reservation_name = capacity.tpu_reservation_name(cfg, project)
    return resource


def to_dict(message) -> dict:
    """A proto-plus message as the REST API's JSON (camelCase, enum names)."""
    from google.protobuf import json_format

    return json_format.MessageToDict(type(message).pb(message))


def step_request(cfg: RunConfig, spec: WorkerSpec, request_id: str) -> dict:
    """What the agent runs. The environment holds no secret: with gcp_conn_id set, the step
    gets that connection without a key, so its storage uses the VM's service account."""
    env = {**spec.env, **credentials.keyless_google_env(
        cfg.gcp_conn_id, cfg.tpu_project or cfg.gcp_project)}
    if is_multi_host(cfg.accelerator_type):
        env.update(POD_ENV)
    return {"id": request_id, "step": spec.step, "command": list(spec.command), "env": env,
            "timeout_seconds": cfg.worker_timeout_minutes * 60}
