"""A small fake kube-apiserver on loopback that the real `kubernetes` client talks to over
real HTTP (no kube-apiserver binary can be installed here).

It serves what bertflow's backend uses, namespaced: services, pods, secrets (v1) and jobs
(batch/v1): create, get, list with a labelSelector, delete (each delete is recorded with its
query and body) with owner-reference garbage collection, and pod logs (`follow` streams in
HTTP chunks as lines arrive; `timestamps` and `sinceSeconds` as the kubelet serves them;
`FakeKube(log_stream_seconds=S)` ends every follow stream after S seconds, as an API server
or a proxy that cuts long streams does). As on a real cluster, a Job deleted without a
propagation policy orphans its pods.

Creating an Indexed Job creates its pods `<job>-<index>-<suffix>` (hostname `<job>-<index>`,
the subdomain, the template's labels, `JOB_COMPLETION_INDEX` from the completion-index
annotation). A pluggable kubelet then plays each pod in a thread: `ScriptedKubelet(script)`
calls `script(pod)` with a `FakePod` whose methods drive phases (unschedulable, running with
log lines, succeeded, OOMKilled, image pull errors, ...); `ProcessKubelet` runs the pod's
container command as a local process (see its docstring).

SelfSubjectAccessReviews (`POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews`) are
answered allowed, except for what `deny(verb, resource, group="", subresource="")` names;
each review's resourceAttributes is kept in `access_reviews`.

What preflight reads and never creates: `GET /api/v1/namespaces/{ns}` (every namespace exists
unless `namespaces` is a set), `GET /api/v1/namespaces/{ns}/serviceaccounts/{name}` (every
one exists, unannotated, unless `service_accounts` maps (ns, name) to its annotations), and
`GET /api/v1/nodes?labelSelector=...` over `nodes` (label dicts; every node's
spec.providerID is `provider_id`, e.g. `gce://proj/us-central1-a/gke-pool-1`).
`forbid(resource)` makes those reads of "namespaces", "serviceaccounts" or "nodes" answer
403, as RBAC does.
"""
from __future__ import annotations

import base64
import contextlib
import copy
import itertools
import json
import os
import re
import secrets as _random
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable
from urllib.parse import parse_qs, urlparse

from loopback_http import LoopbackServer, QuietHandler

ROOT = Path(__file__).resolve().parent.parent
INDEX = "batch.kubernetes.io/job-completion-index"
KINDS = {"services": "Service", "pods": "Pod", "secrets": "Secret", "jobs": "Job"}
_ACCESS_REVIEW = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
_READS = re.compile(r"^/api/v1/(?:namespaces/([^/]+)(?:/serviceaccounts/([^/]+))?|(nodes))$")
_PATH = re.compile(r"^/(?:api/v1|apis/batch/v1)/namespaces/([^/]+)/(services|pods|secrets|jobs)"
                   r"(?:/([^/]+))?(?:/(log))?$")


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _rfc3339_nano(ns: int) -> str:
    """As the kubelet stamps log lines: RFC3339 with nanoseconds, trailing zeros trimmed."""
    whole = datetime.fromtimestamp(ns // 10**9, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    frac = f"{ns % 10**9:09d}".rstrip("0")
    return f"{whole}.{frac}Z" if frac else f"{whole}Z"


def _started_at(status: dict) -> str | None:
    """The running container's startedAt in a pod status, else None."""
    container = (status.get("containerStatuses") or [{}])[0]
    return container.get("state", {}).get("running", {}).get("startedAt")


def _matches(labels: dict, selector: str) -> bool:
    for term in filter(None, (selector or "").split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term not in labels:
            return False
    return True


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class _Handler(QuietHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.server.fake._handle(self, "GET")

    def do_POST(self):
        self.server.fake._handle(self, "POST")

    def do_DELETE(self):
        self.server.fake._handle(self, "DELETE")


class FakePod:
    """One pod as the kubelet sees it; scripts drive its status through these methods."""

    def __init__(self, fake: "FakeKube", namespace: str, name: str):
        self.fake = fake
        self.namespace = namespace
        self.name = name
        self.deleted = threading.Event()
        self._on_delete: list[Callable[[], None]] = []
        self._on_terminate: list[Callable[[float], None]] = []
        obj = fake.get("pods", namespace, name)
        labels = obj["metadata"]["labels"]
        self.role = labels.get("bertflow.dev/role", "")
        self.index = int(obj["metadata"]["annotations"][INDEX])
        self.hostname = obj["spec"].get("hostname", name)
        self.container = obj["spec"]["containers"][0]

    # --- status -----------------------------------------------------------------------------
    def _update(self, phase: str, *, conditions=None, state=None, ready=False, **extra):
        if state is not None and "terminated" in state:  # as the kubelet reports it
            state = {"terminated": {"finishedAt": _now(), **state["terminated"]}}

        def change(obj):
            status = {"phase": phase, "conditions": conditions or [
                {"type": "PodScheduled", "status": "True"}], **extra}
            if state is not None and "terminated" in state:  # startedAt stays, if it ran
                started = _started_at(obj["status"])
                state["terminated"].update({"startedAt": started} if started else {})
            if state is not None:
                status["containerStatuses"] = [{
                    "name": self.container["name"], "image": self.container["image"],
                    "imageID": "", "ready": ready, "restartCount": 0, "state": state}]
            obj["status"] = status
        self.fake._change_pod(self.namespace, self.name, change)

    def unschedulable(self, message: str) -> None:
        self._update("Pending", conditions=[{"type": "PodScheduled", "status": "False",
                                             "reason": "Unschedulable", "message": message}])

    def schedule(self) -> None:
        self._update("Pending", state={"waiting": {"reason": "ContainerCreating"}})

    def image_pull_error(self, reason: str = "ErrImagePull",
                         message: str = "rpc error: pull access denied") -> None:
        self._update("Pending", state={"waiting": {"reason": reason, "message": message}})

    def run(self) -> None:
        self._update("Running", state={"running": {"startedAt": _now()}}, ready=True)

    def log(self, *lines: str) -> None:
        """Lines written at once carry one timestamp, as lines of one write can."""
        with self.fake.cond:
            stamp = time.time_ns()
            self.fake.logs.setdefault(self.name, []).extend((stamp, ln) for ln in lines)
            self.fake.cond.notify_all()

    def succeed(self) -> None:
        self._update("Succeeded", state={"terminated": {"exitCode": 0, "reason": "Completed"}})

    def fail(self, exit_code: int = 1, reason: str = "Error", **extra) -> None:
        self._update("Failed", state={"terminated": {"exitCode": exit_code, "reason": reason}},
                     **extra)

    def evict(self, message: str = "The node was low on resource: memory.") -> None:
        self._update("Failed", reason="Evicted", message=message,
                     state={"terminated": {"exitCode": 137, "reason": "Error"}})

    def preempt(self) -> None:
        self._update("Failed", conditions=[
            {"type": "PodScheduled", "status": "True"},
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
             "message": "Preempted in order to admit critical pod"}],
            state={"terminated": {"exitCode": 137, "reason": "Error"}})

    def on_terminate(self, callback: Callable[[float], None]) -> None:
        """The kubelet's graceful stop of the container (SIGTERM, grace, SIGKILL)."""
        self._on_terminate.append(callback)

    def terminate(self, grace_seconds: float) -> None:
        for callback in self._on_terminate:
            callback(grace_seconds)

    def wait_deleted(self, timeout: float = 30) -> bool:
        return self.deleted.wait(timeout)

    def on_delete(self, callback: Callable[[], None]) -> None:
        self._on_delete.append(callback)
        if self.deleted.is_set():
            callback()

    def _deleted(self) -> None:
        self.deleted.set()
        for callback in self._on_delete:
            callback()

    # --- what the container gets ------------------------------------------------------------
    def environment(self) -> dict[str, str]:
        """The container's env as a kubelet resolves it: envFrom Secrets, then env (with the
        completion-index fieldRef). Raises KeyError for a missing Secret."""
        obj = self.fake.get("pods", self.namespace, self.name)
        env: dict[str, str] = {}
        for source in self.container.get("envFrom", []):
            secret = self.fake.get("secrets", self.namespace, source["secretRef"]["name"])
            if secret is None:
                raise KeyError(source["secretRef"]["name"])
            env.update({k: base64.b64decode(v).decode()
                        for k, v in secret.get("data", {}).items()})
        for item in self.container.get("env", []):
            if "value" in item:
                env[item["name"]] = item["value"]
            elif "fieldRef" in item.get("valueFrom", {}):
                path = item["valueFrom"]["fieldRef"]["fieldPath"]
                key = re.match(r"metadata\.annotations\['(.+)'\]", path).group(1)
                env[item["name"]] = obj["metadata"]["annotations"][key]
        return env


class ScriptedKubelet:
    """Plays every pod with `script(pod: FakePod)` in its own thread."""

    def __init__(self, script: Callable[[FakePod], None]):
        self.script = script

    def __call__(self, pod: FakePod) -> None:
        self.script(pod)

    def shutdown(self) -> None:
        pass


def run_then_succeed(pod: FakePod) -> None:
    """Default script: a pod that says hello and succeeds."""
    pod.schedule()
    pod.run()
    pod.log(f"hello from {pod.role}:{pod.index}")
    pod.succeed()


class FakeKube(LoopbackServer):
    """Start with `with FakeKube(kubelet) as kube:`; `kube.write_kubeconfig(path)` points the
    client at it."""

    def __init__(self, kubelet: Callable[[FakePod], None] | None = None,
                 log_stream_seconds: float | None = None):
        self.kubelet = kubelet or ScriptedKubelet(run_then_succeed)
        self.log_stream_seconds = log_stream_seconds
        self.log_requests: list[dict] = []  # the query of every log request
        self.store: dict[tuple[str, str, str], dict] = {}
        self.logs: dict[str, list[tuple[int, str]]] = {}  # pod -> (time in ns, line)
        self.deletes: list[dict] = []
        self.created: list[dict] = []  # every object as created (deep copies)
        self.pods: dict[str, FakePod] = {}
        self.denied: set[tuple[str, str, str, str]] = set()  # (verb, group, resource, sub)
        self.access_reviews: list[dict] = []
        self.namespaces: set[str] | None = None
        self.service_accounts: dict[tuple[str, str], dict] | None = None
        self.nodes: list[dict[str, str]] = []
        self.provider_id = ""
        self.forbidden: set[str] = set()
        self.cond = threading.Condition()
        self._rv = itertools.count(1)
        self._closing = False
        super().__init__(_Handler)
        self.server.fake = self

    # --- lifecycle ----------------------------------------------------------------------------
    def __exit__(self, *exc) -> None:
        with self.cond:
            self._closing = True
            pods = list(self.pods.values())
            self.cond.notify_all()
        for pod in pods:
            pod._deleted()
        self.kubelet.shutdown() if hasattr(self.kubelet, "shutdown") else None
        self.stop()

    @property
    def url(self) -> str:
        return self.endpoint

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake",
                                                      "namespace": namespace}}]}))
        return path

    # --- test helpers -------------------------------------------------------------------------
    def get(self, plural: str, namespace: str, name: str) -> dict | None:
        with self.cond:
            obj = self.store.get((plural, namespace, name))
            return copy.deepcopy(obj) if obj else None

    def names(self, plural: str, namespace: str = "default", selector: str = "") -> list[str]:
        with self.cond:
            return sorted(n for (p, ns, n), o in self.store.items()
                          if p == plural and ns == namespace
                          and _matches(o["metadata"].get("labels") or {}, selector))

    def created_names(self, plural: str, namespace: str = "default") -> list[str]:
        """Names of every object of a kind ever created (deleted ones too)."""
        kind = KINDS[plural]
        with self.cond:
            return [o["metadata"]["name"] for o in self.created
                    if o.get("kind") == kind and o["metadata"]["namespace"] == namespace]

    def backdate(self, plural: str, namespace: str, name: str, minutes: float) -> None:
        """Make an object look older (for the sweep's grace period)."""
        with self.cond:
            meta = self.store[(plural, namespace, name)]["metadata"]
            then = datetime.now(timezone.utc) - timedelta(minutes=minutes)
            meta["creationTimestamp"] = then.strftime("%Y-%m-%dT%H:%M:%SZ")
            if plural == "jobs":
                self.store[(plural, namespace, name)]["status"]["startTime"] = \
                    meta["creationTimestamp"]

    def deny(self, verb: str, resource: str, group: str = "", subresource: str = "") -> None:
        """SelfSubjectAccessReviews for this verb on this resource answer not allowed (the
        fake enforces nothing else: it only answers reviews)."""
        self.denied.add((verb, group, resource, subresource))

    def forbid(self, resource: str) -> None:
        """Reads of namespaces, serviceaccounts or nodes answer 403 Forbidden."""
        self.forbidden.add(resource)

    def _read(self, handler: _Handler, match: re.Match, selector: str) -> None:
        """The objects preflight reads: a namespace, a ServiceAccount, a node list."""
        namespace, account, nodes = match.groups()
        resource = "nodes" if nodes else "serviceaccounts" if account else "namespaces"
        if resource in self.forbidden:
            return handler.reply_json(403, _status(403, "Forbidden", (
                f'{resource} is forbidden: User "fake" cannot get resource "{resource}"')))
        if nodes:
            items = [{"metadata": {"name": f"node-{i}", "labels": labels},
                      "spec": {"providerID": self.provider_id} if self.provider_id else {}}
                     for i, labels in enumerate(self.nodes) if _matches(labels, selector)]
            return handler.reply_json(200, {"kind": "NodeList", "apiVersion": "v1",
                                           "metadata": {}, "items": items})
        if self.namespaces is not None and namespace not in self.namespaces:
            return handler.reply_json(404, _status(404, "NotFound",
                                                  f'namespaces "{namespace}" not found'))
        if not account:
            return handler.reply_json(200, {"kind": "Namespace", "apiVersion": "v1",
                                           "metadata": {"name": namespace}})
        accounts = self.service_accounts
        if accounts is not None and (namespace, account) not in accounts:
            return handler.reply_json(404, _status(
                404, "NotFound", f'serviceaccounts "{account}" not found'))
        annotations = (accounts or {}).get((namespace, account)) or {}
        handler.reply_json(200, {"kind": "ServiceAccount", "apiVersion": "v1", "metadata": {
            "name": account, "namespace": namespace, "annotations": annotations}})

    def _access_review(self, body: dict) -> dict:
        attrs = (body.get("spec") or {}).get("resourceAttributes") or {}
        self.access_reviews.append(dict(attrs))
        key = (attrs.get("verb", ""), attrs.get("group", ""), attrs.get("resource", ""),
               attrs.get("subresource", ""))
        allowed = key not in self.denied
        reason = "" if allowed else "RBAC: no rule allows it (fake)"
        return {**body, "status": {"allowed": allowed, "reason": reason}}

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10) -> bool:
        with self.cond:
            return self.cond.wait_for(predicate, timeout)

    # --- HTTP ---------------------------------------------------------------------------------
    def _handle(self, handler: _Handler, method: str) -> None:
        url = urlparse(handler.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        raw = handler.body()
        body = json.loads(raw) if raw else None
        if url.path == _ACCESS_REVIEW and method == "POST":
            return handler.reply_json(201, self._access_review(body or {}))
        reads = _READS.match(url.path)
        if reads and method == "GET":
            return self._read(handler, reads, query.get("labelSelector", ""))
        match = _PATH.match(url.path)
        if not match:
            return handler.reply_json(404, _status(404, "NotFound", f"no route {url.path}"))
        namespace, plural, name, log = match.groups()
        try:
            if log and method == "GET":
                return self._stream_log(handler, namespace, name, query)
            if method == "POST" and not name:
                return handler.reply_json(201, self._create(plural, namespace, body))
            if method == "GET" and name:
                obj = self.get(plural, namespace, name)
                if obj is None:
                    raise LookupError(f'{plural} "{name}" not found')
                return handler.reply_json(200, obj)
            if method == "GET":
                return handler.reply_json(200, self._list(plural, namespace,
                                                         query.get("labelSelector", "")))
            if method == "DELETE" and name:
                self._delete_request(plural, namespace, name, query, body)
                return handler.reply_json(200, {"kind": "Status", "apiVersion": "v1",
                                               "metadata": {}, "status": "Success"})
        except LookupError as err:
            return handler.reply_json(404, _status(404, "NotFound", str(err)))
        except FileExistsError as err:
            return handler.reply_json(409, _status(409, "AlreadyExists", str(err)))
        handler.reply_json(405, _status(405, "MethodNotAllowed", method))

    def _list(self, plural: str, namespace: str, selector: str) -> dict:
        with self.cond:
            items = [copy.deepcopy(o) for (p, ns, _), o in sorted(self.store.items())
                     if p == plural and ns == namespace
                     and _matches(o["metadata"].get("labels") or {}, selector)]
        api = "batch/v1" if plural == "jobs" else "v1"
        return {"kind": f"{KINDS[plural]}List", "apiVersion": api,
                "metadata": {"resourceVersion": str(next(self._rv))}, "items": items}

    def _create(self, plural: str, namespace: str, body: dict) -> dict:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=_now(),
                    resourceVersion=str(next(self._rv)))
        if plural == "secrets" and "stringData" in obj:  # as the API server stores it
            obj.setdefault("data", {}).update(
                {k: base64.b64encode(v.encode()).decode()
                 for k, v in obj.pop("stringData").items()})
        with self.cond:
            key = (plural, namespace, meta["name"])
            if key in self.store:
                raise FileExistsError(f'{plural} "{meta["name"]}" already exists')
            if plural == "jobs":
                obj["status"] = {"startTime": meta["creationTimestamp"], "active": 0}
            self.store[key] = obj
            self.created.append(copy.deepcopy(obj))
            self.cond.notify_all()
        if plural == "jobs":
            self._start_job(namespace, obj)
        return copy.deepcopy(obj)

    def _start_job(self, namespace: str, job: dict) -> None:
        """The Job controller for an Indexed Job: one pod per completion index."""
        name = job["metadata"]["name"]
        template = job["spec"]["template"]
        for index in range(job["spec"]["completions"]):
            pod_spec = copy.deepcopy(template["spec"])
            pod_spec["hostname"] = f"{name}-{index}"
            for container in pod_spec["containers"]:
                container.setdefault("env", []).append({
                    "name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
                        "fieldPath": f"metadata.annotations['{INDEX}']"}}})
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": f"{name}-{index}-{_random.token_hex(3)[:5]}",
                "labels": {**template["metadata"].get("labels", {}), "job-name": name,
                           "batch.kubernetes.io/job-name": name, INDEX: str(index)},
                "annotations": {INDEX: str(index)},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                     "uid": job["metadata"]["uid"], "controller": True}]},
                "spec": pod_spec, "status": {"phase": "Pending"}}
            created = self._create("pods", namespace, pod)
            handle = FakePod(self, namespace, created["metadata"]["name"])
            with self.cond:
                self.pods[handle.name] = handle
            threading.Thread(target=self._play, args=(handle,), daemon=True).start()

    def _play(self, pod: FakePod) -> None:
        try:
            self.kubelet(pod)
        except Exception as err:  # noqa: BLE001 (a script bug shows in the pod's log)
            if not pod.deleted.is_set():
                pod.log(f"fake kubelet error: {err!r}")

    def _change_pod(self, namespace: str, name: str, change: Callable[[dict], None]) -> None:
        with self.cond:
            obj = self.store.get(("pods", namespace, name))
            if obj is None:
                return
            change(obj)
            self._sync_job(namespace, obj)
            self.cond.notify_all()

    def _sync_job(self, namespace: str, pod: dict) -> None:
        """Job status from its pods: Failed on the first failed pod (backoffLimit 0),
        Complete when every index succeeded."""
        owner = next((o for o in pod["metadata"].get("ownerReferences", [])
                      if o["kind"] == "Job"), None)
        job = self.store.get(("jobs", namespace, owner["name"])) if owner else None
        if job is None:
            return
        pods = [o for (p, ns, _), o in self.store.items() if p == "pods" and ns == namespace
                and any(r["uid"] == job["metadata"]["uid"]
                        for r in o["metadata"].get("ownerReferences", []))]
        phases = [p["status"].get("phase") for p in pods]
        status = job["status"]
        status.update(succeeded=phases.count("Succeeded"), failed=phases.count("Failed"),
                      active=sum(ph in ("Pending", "Running") for ph in phases))
        if status.get("conditions"):
            return
        if status["failed"]:
            status["conditions"] = [{"type": "Failed", "status": "True",
                                     "reason": "BackoffLimitExceeded",
                                     "message": "Job has reached the specified backoff limit"}]
        elif status["succeeded"] == job["spec"]["completions"]:
            status["conditions"] = [{"type": "Complete", "status": "True"}]

    def set_job_condition(self, namespace: str, name: str, kind: str, reason: str = "") -> None:
        with self.cond:
            self.store[("jobs", namespace, name)]["status"]["conditions"] = [
                {"type": kind, "status": "True", "reason": reason or kind}]

    # --- disruptions --------------------------------------------------------------------
    def delete_pod_gracefully(self, name: str, namespace: str = "default",
                              grace_seconds: float = 30.0, linger_seconds: float = 1.0) -> None:
        """`kubectl delete pod --grace-period`, or graceful node shutdown of a spot node: the
        pod gets a deletionTimestamp, the kubelet sends SIGTERM, waits the grace period, then
        SIGKILL; the ended pod stays readable for `linger_seconds` (the Job controller's
        tracking finalizer) with its exit code, then goes. Returns at once."""
        pod = self.pods[name]

        def mark(obj):
            obj["metadata"]["deletionTimestamp"] = _now()
            obj["metadata"]["deletionGracePeriodSeconds"] = int(grace_seconds)
        self._change_pod(namespace, name, mark)

        def kubelet():
            pod.terminate(grace_seconds)
            self.wait_for(lambda: (self.get("pods", namespace, name) or {}).get(
                "status", {}).get("phase") in ("Succeeded", "Failed", None), timeout=5)
            time.sleep(linger_seconds)
            with contextlib.suppress(LookupError):
                self._delete("pods", namespace, name, "Background")
        threading.Thread(target=kubelet, daemon=True).start()

    def remove_node(self, pod_names: list[str], namespace: str = "default") -> None:
        """A node taken away (deleted, or a spot VM reclaimed without graceful shutdown): its
        pods' processes are killed and the pods vanish at once (pod garbage collection)."""
        for name in pod_names:
            with contextlib.suppress(LookupError):
                self._delete("pods", namespace, name, "Background")

    def _delete_request(self, plural, namespace, name, query, body) -> None:
        policy = (body or {}).get("propagationPolicy") or query.get("propagationPolicy")
        with self.cond:
            self.deletes.append({"plural": plural, "namespace": namespace, "name": name,
                                 "query": dict(query), "body": body,
                                 "propagationPolicy": policy})
        # batch/v1 Jobs deleted through the API default to orphaning their pods.
        self._delete(plural, namespace, name,
                     policy or ("Orphan" if plural == "jobs" else "Background"))

    def _delete(self, plural: str, namespace: str, name: str, policy: str) -> None:
        with self.cond:
            obj = self.store.pop((plural, namespace, name), None)
            if obj is None:
                raise LookupError(f'{plural} "{name}" not found')
            uid = obj["metadata"]["uid"]
            dependents = [k for k, o in self.store.items()
                          if any(r["uid"] == uid for r in o["metadata"].get("ownerReferences",
                                                                              []))]
            if policy == "Orphan":
                for key in dependents:
                    refs = self.store[key]["metadata"]["ownerReferences"]
                    self.store[key]["metadata"]["ownerReferences"] = [
                        r for r in refs if r["uid"] != uid]
                dependents = []
            pod = self.pods.pop(name, None) if plural == "pods" else None
            self.cond.notify_all()
        if pod is not None:
            pod._deleted()
        for dep_plural, dep_ns, dep_name in dependents:  # the garbage collector
            try:
                self._delete(dep_plural, dep_ns, dep_name, "Background")
            except LookupError:
                pass

    def _stream_log(self, handler: _Handler, namespace: str, name: str, query: dict) -> None:
        pod = self.get("pods", namespace, name)
        if pod is None:
            return handler.reply_json(404, _status(404, "NotFound", f'pods "{name}" not found'))
        if pod["status"].get("phase") == "Pending":
            return handler.reply_json(400, _status(400, "BadRequest", f'container "worker" in '
                                                  f'pod "{name}" is waiting to start'))
        self.log_requests.append(dict(query, pod=name))
        follow = query.get("follow", "").lower() == "true"  # the client sends "True"
        stamped = query.get("timestamps", "").lower() == "true"
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        sent = 0
        cut_at = (time.monotonic() + self.log_stream_seconds
                  if follow and self.log_stream_seconds else None)
        with self.cond:
            lines = self.logs.get(name, [])
            if "tailLines" in query:
                sent = max(0, len(lines) - int(query["tailLines"]))
            if "sinceSeconds" in query:
                since = time.time_ns() - int(query["sinceSeconds"]) * 10**9
                sent = max(sent, next((i for i, (ns, _) in enumerate(lines) if ns >= since),
                                      len(lines)))
        try:
            while True:
                with self.cond:
                    lines = self.logs.get(name, [])
                    current = self.store.get(("pods", namespace, name))
                    done = (not follow or self._closing or current is None
                            or current["status"].get("phase") in ("Succeeded", "Failed"))
                    new, sent = lines[sent:], len(lines)
                    if cut_at is not None and time.monotonic() >= cut_at:
                        done = True  # the server ends the stream, the pod runs on
                    if not new and not done:
                        self.cond.wait(0.5 if cut_at is None else
                                       max(0.0, min(0.5, cut_at - time.monotonic())))
                        continue
                for ns, line in new:
                    data = ((_rfc3339_nano(ns) + " " if stamped else "") + line + "\n").encode()
                    handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                handler.wfile.flush()
                if done:
                    break
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass


class ProcessKubelet:
    """Runs each pod's container command as a real local process: `python` is this
    interpreter, PYTHONPATH the project, env and envFrom Secret values as a kubelet resolves
    them, the process's output is the pod log and its exit code the phase; deleting the pod
    kills its process group.

    Pod DNS names (`<job>-<index>.<service>`, from the pod's BERTFLOW_TF_CLUSTER) resolve to
    127.0.0.1 only inside the process: it runs under `unshare --mount` with a private
    /etc/hosts bind-mounted over the real one (test-only; needs root, see `available()`).
    GRPC_DNS_RESOLVER=native makes TensorFlow's gRPC resolve through getaddrinfo (and so
    /etc/hosts) rather than its own DNS client.

    `hidden`: folders the pods' image does not have (an empty tmpfs is mounted over each in
    the pod's private mount namespace). `own_cache`: each pod gets its own XDG_CACHE_HOME,
    empty at start, as a new container's is.
    """

    def __init__(self, workdir: Path, hidden: tuple[Path, ...] = (), own_cache: bool = False):
        self.hidden = tuple(Path(p) for p in hidden)
        self.own_cache = own_cache
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()

    @staticmethod
    def available() -> bool:
        probe = subprocess.run(["unshare", "--mount", "sh", "-c",
                                "mount --bind /etc/hostname /etc/hosts"],
                               capture_output=True)
        return probe.returncode == 0

    def mounts(self) -> str:
        """The shell commands a pod runs first: its /etc/hosts ($0), the hidden folders."""
        return " && ".join(['mount --bind "$0" /etc/hosts'] + [
            f"mount -t tmpfs -o size=1m tmpfs {shlex.quote(str(p))}" for p in self.hidden])

    def _hosts_file(self, pod: FakePod, env: dict[str, str]) -> Path:
        names = {pod.hostname}
        for addresses in json.loads(env.get("BERTFLOW_TF_CLUSTER") or "{}").values():
            for address in addresses:
                host = address.rsplit(":", 1)[0]
                names |= {host, host.split(".")[0],
                          f"{host}.{pod.namespace}.svc.cluster.local"}
        path = self.workdir / f"{pod.name}.hosts"
        path.write_text(Path("/etc/hosts").read_text() + "\n" +
                        "".join(f"127.0.0.1 {n}\n" for n in sorted(names)))
        return path

    def __call__(self, pod: FakePod) -> None:
        pod.schedule()
        try:
            env = pod.environment()
        except KeyError as err:
            pod.image_pull_error("CreateContainerConfigError", f"secret {err} not found")
            return
        argv = list(pod.container["command"]) + list(pod.container.get("args", []))
        if argv[0] == "python":
            argv[0] = sys.executable
        tmp = self.workdir / f"{pod.name}.tmp"
        tmp.mkdir(exist_ok=True)
        full_env = {**{k: v for k, v in os.environ.items() if k != "TF_CONFIG"}, **env,
                    "PYTHONPATH": str(ROOT), "GRPC_DNS_RESOLVER": "native",
                    "HOSTNAME": pod.hostname, "TMPDIR": str(tmp)}
        if self.own_cache:
            full_env["XDG_CACHE_HOME"] = str(tmp / "cache")
        hosts = self._hosts_file(pod, env)
        proc = subprocess.Popen(
            ["unshare", "--mount", "sh", "-c", self.mounts() + ' && exec "$@"',
             str(hosts), *argv], env=full_env, cwd=ROOT, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
            start_new_session=True)
        with self._lock:
            self._procs.append(proc)
        pod.on_delete(lambda: _kill_group(proc))
        pod.on_terminate(lambda grace: _stop_group(proc, grace))
        pod.run()
        for line in proc.stdout:
            pod.log(line.rstrip("\n"))
        code = proc.wait()
        if pod.deleted.is_set():
            return
        if code == 0:
            pod.succeed()
        else:
            pod.fail(exit_code=code if code > 0 else 128 - code)

    def shutdown(self) -> None:
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            _kill_group(proc)

    def live_processes(self, wait: float = 0) -> list[subprocess.Popen]:
        """Pod processes still running, after waiting up to `wait` seconds for them to end: a
        deleted pod is sent SIGKILL, and a TensorFlow process takes a moment to exit."""
        deadline = time.monotonic() + wait
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        return [p for p in procs if p.poll() is None]


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_group(proc: subprocess.Popen, grace_seconds: float) -> None:
    """What a kubelet does to a container it stops: SIGTERM, the grace period, SIGKILL."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.wait()
