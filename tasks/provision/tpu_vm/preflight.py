"""The Cloud TPU part of preflight (tasks/provision/preflight.py): the zone offers the
accelerator type and the runtime version; on the workers' side, the VM's service account may
use the buckets (its bindings in their IAM policies) and the image exists
(tasks/provision/image_registry.py). TPU quota is not checked (see QUOTA)."""
from __future__ import annotations

from tasks.config import RunConfig
from tasks.errors import BertflowError
from tasks.provision import image_registry, worker_identity
from tasks.provision.preflight import DOCS, Check, api_message, not_checked
from tasks.runs.runlayout import RunContext
from tasks.provision.tpu_vm.client import resolve_project, tpu_client
from tasks.provision.tpu_vm.render import runtime_version, worker_image

# Cloud TPU, "Cloud TPU quotas": quota is per TPU generation and per kind (on-demand,
# preemptible/spot, reserved), in chips or TensorCores by generation, and the Cloud TPU API
# names no metric a request maps to; the queued resource names the quota it exceeds.
QUOTA = ("Cloud TPU quota is per generation and kind (on-demand, spot, reserved) in chips or "
         "TensorCores, with no metric the API maps accelerator_type to; a queued resource "
         "that exceeds it fails with the quota's name (check IAM & Admin > Quotas, service "
         "tpu.googleapis.com)")


def checks(cfg: RunConfig, ctx: RunContext) -> list[Check]:
    from google.api_core import exceptions

    try:
        client, found = tpu_client(cfg)
        project = resolve_project(cfg, found)
        version = runtime_version(cfg)
    except BertflowError as err:
        return [Check("tpu_vm", "project and zone", False, f"Cloud TPU: {err}")]
    parent = f"projects/{project}/locations/{cfg.tpu_zone}"
    found = []
    for what, wanted, lister, field, knob in (
            ("accelerator type", cfg.accelerator_type, client.list_accelerator_types, "type_",
             "accelerator_type"),
            ("runtime version", version, client.list_runtime_versions, "version",
             "tpu_runtime_version")):
        label = f"{cfg.tpu_zone} offers {what} {wanted}"
        try:
            offered = sorted({getattr(item, field) for item in lister(parent=parent)})
        except (exceptions.PermissionDenied, exceptions.Forbidden) as err:
            # roles/tpu.admin holds tpu.* (IAM "Cloud TPU roles and permissions").
            found.append(Check("tpu_vm", label, False, (
                f"Cloud TPU: cannot list {what}s in {parent}: {api_message(err)} (grant "
                f"the caller roles/tpu.admin on project {project}, which holds "
                f"tpu.acceleratortypes.list, tpu.runtimeversions.list and the queued "
                f"resource and node permissions; and enable tpu.googleapis.com; {DOCS})")))
            continue
        except exceptions.GoogleAPICallError as err:
            found.append(Check("tpu_vm", label, False, (
                f"Cloud TPU: zone {cfg.tpu_zone} of project {project} does not answer: "
                f"{api_message(err)} (check tpu_zone and tpu_project, and that "
                f"tpu.googleapis.com is enabled)")))
            continue
        except Exception as err:  # noqa: BLE001 (credentials refused, no network)
            found.append(Check("tpu_vm", label, False, (
                f"Cloud TPU: cannot reach {parent}: {type(err).__name__}: {str(err)[:200]}")))
            continue
        if wanted in offered:
            found.append(Check("tpu_vm", label, True))
        else:
            near = [o for o in offered if o.startswith(wanted.rsplit("-", 1)[0])] or offered
            found.append(Check("tpu_vm", label, False, (
                f"Cloud TPU: zone {cfg.tpu_zone} does not offer {what} {wanted} (set {knob} "
                f"to one it offers, e.g. {', '.join(near[:8]) or 'none listed'}; or pick "
                f"another tpu_zone)")))
    account = cfg.service_account or "the Compute Engine default service account"
    puller = f"the VM's service account ({account})"
    found += worker_identity.service_account_checks(cfg)
    found += image_registry.checks(cfg, {worker_image(cfg): "train, evaluate"}, puller)
    found.append(not_checked("quota", f"{cfg.accelerator_type} in {cfg.tpu_zone}", QUOTA))
    return found
