"""A fake Cloud TPU API (v2, REST) on loopback, driven by the real `google.cloud.tpu_v2`
TpuClient (`BERTFLOW_TPU_ENDPOINT=http://127.0.0.1:PORT`).

It serves the paths the client's REST transport calls (google/cloud/tpu_v2/services/tpu/
transports/rest_base.py):

- `POST   /v2/projects/*/locations/*/queuedResources?queuedResourceId=ID` -> Operation (done)
- `GET    /v2/projects/*/locations/*/queuedResources[/ID]`
- `DELETE /v2/projects/*/locations/*/queuedResources/ID[?force=true]` -> Operation (done)
- `GET    /v2/projects/*/locations/*/nodes/ID`, `DELETE` the same -> Operation (done)
- `PATCH  /v2/projects/*/locations/*/nodes/ID?updateMask=labels` -> Operation (done): the
  node's labels replaced by the body's (only the labels mask is served)
- `GET    /v2/projects/*/locations/*/operations/ID`
- `GET    /v2/projects/*/locations/*/acceleratorTypes`, `.../runtimeVersions`: what the zone
  offers (`accelerator_types`, `runtime_versions`; a zone not in `zones` answers 404)

Long-running operations are done at once, with the resource (or Empty) as response. A queued
resource's state follows a script: each GET of it moves one step along `states` (the last
state sticks), so a test writes WAITING_FOR_RESOURCES -> PROVISIONING -> ACTIVE, FAILED with
a message, or a queue that never moves. Its node appears when it turns ACTIVE. Every request
is recorded (method, path, query, body) for order and secret checks.

`reclaim(name)` plays the platform taking a spot TPU back: the queued resource turns SUSPENDED
(state initiator SERVICE) and its node PREEMPTED. `on_boot(node)` / `on_halt(node)`, when set,
are called as a node appears and as it is preempted or deleted, so a test can start and stop
what the VM's startup script would run (the agent).
"""
from __future__ import annotations

import json
import re
import threading
import uuid
from urllib.parse import parse_qs, urlparse

from loopback_http import LoopbackServer, QuietHandler

QR_TYPE = "type.googleapis.com/google.cloud.tpu.v2.QueuedResource"
NODE_TYPE = "type.googleapis.com/google.cloud.tpu.v2.Node"
EMPTY_TYPE = "type.googleapis.com/google.protobuf.Empty"
META_TYPE = "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"

_PATH = re.compile(r"^/v2/(projects/[^/]+/locations/[^/]+)/(queuedResources|nodes|operations|"
                   r"acceleratorTypes|runtimeVersions)(?:/([^/:]+))?$")


class FakeTpu(LoopbackServer):
    """`endpoint` is the base URL; `states` is the script given to the next created queued
    resource (`failure` its FAILED message); `requests` lists what the client sent."""

    def __init__(self):
        self.queued: dict[str, dict] = {}    # full name -> resource JSON
        self.nodes: dict[str, dict] = {}     # full name -> node JSON
        self.scripts: dict[str, list[str]] = {}
        self.operations: dict[str, dict] = {}
        self.requests: list[dict] = []
        self.states = ["WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"]
        self.failure = "Quota limit 'TPUV5sLitepodServingPerProjectPerZoneForTPUAPI' exceeded"
        # What every zone offers (zones=None: any zone answers).
        self.accelerator_types = ["v4-8", "v4-16", "v5litepod-1", "v5litepod-4", "v5litepod-8",
                                  "v5litepod-16", "v6e-8"]
        self.runtime_versions = ["tpu-vm-tf-2.20.0-pjrt", "tpu-vm-tf-2.20.0-pod-pjrt",
                                 "tpu-vm-tf-2.18.0-pjrt", "v2-alpha-tpuv5-lite",
                                 "tpu-ubuntu2204-base"]
        self.zones: set[str] | None = None
        self.on_boot = self.on_halt = None  # callables of the node's name, or None
        self.suspended_by: dict[str, str] = {}  # queued resource -> state initiator
        self.lock = threading.Lock()
        fake = self

        class Handler(QuietHandler):
            def _handle(self):
                url = urlparse(self.path)
                raw = self.body()
                body = json.loads(raw) if raw else None
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                with fake.lock:
                    fake.requests.append({"method": self.command, "path": url.path,
                                          "query": query, "body": body})
                    status, payload = fake.route(self.command, url.path, query, body)
                self.reply_json(status, payload)

            do_GET = do_POST = do_DELETE = do_PATCH = _handle

        super().__init__(Handler)

    # --- what tests inspect -----------------------------------------------------------------
    def calls(self, method: str | None = None) -> list[tuple[str, str]]:
        """(method, resource path without /v2/) of each request, in order."""
        return [(r["method"], r["path"][len("/v2/"):]) for r in self.requests
                if method is None or r["method"] == method]

    def add_queued(self, name: str, resource: dict, state: str) -> None:
        """A queued resource made outside the code under test (sweep tests)."""
        with self.lock:
            self.queued[name] = {**resource, "name": name, "state": {"state": state}}
            self.scripts[name] = [state]
            if state == "ACTIVE":
                self._make_node(name)

    def reclaim(self, name: str, by: str = "SERVICE") -> None:
        """The queued resource `name` loses its capacity: SUSPENDED, its node PREEMPTED (a
        spot preemption when `by` is SERVICE, a person's doing when USER)."""
        with self.lock:
            self.scripts[name] = ["SUSPENDED"]
            self.suspended_by[name] = by
            node = self._node_name(name)
            if node in self.nodes:
                self.nodes[node]["state"] = "PREEMPTED"
                self._halt(node)

    def _halt(self, node: str) -> None:
        if self.on_halt is not None:
            self.on_halt(node)

    # --- the API --------------------------------------------------------------------------
    def route(self, method: str, path: str, query: dict, body):
        match = _PATH.match(path)
        if not match:
            return _error(404, f"no route {method} {path}")
        parent, kind, rid = match.groups()
        name = f"{parent}/{kind}/{rid}" if rid else None
        if kind in ("acceleratorTypes", "runtimeVersions") and method == "GET" and not rid:
            zone = parent.rsplit("/", 1)[1]
            if self.zones is not None and zone not in self.zones:
                return _error(404, f"Location {parent} is not found or access is unauthorized.")
            if kind == "acceleratorTypes":
                return 200, {"acceleratorTypes": [{"name": f"{parent}/acceleratorTypes/{t}",
                                                   "type": t} for t in self.accelerator_types]}
            return 200, {"runtimeVersions": [{"name": f"{parent}/runtimeVersions/{v}",
                                              "version": v} for v in self.runtime_versions]}
        if kind == "operations":
            op = self.operations.get(name)
            return (200, op) if op else _error(404, f"operation {name} not found")
        if kind == "queuedResources":
            if method == "POST" and not rid:
                return self._create_queued(parent, query, body)
            if method == "GET" and not rid:
                return 200, {"queuedResources": [self._advance(n) for n in sorted(self.queued)
                                                  if n.startswith(parent + "/")]}
            if name not in self.queued:
                return _error(404, f"Resource '{name}' was not found")
            if method == "GET":
                return 200, self._advance(name)
            if method == "DELETE":
                node = self._node_name(name)
                if node in self.nodes and query.get("force") != "true":
                    return _error(400, f"queued resource {name} has a node; delete it first or "
                                       "use force")
                del self.queued[name]
                if self.nodes.pop(node, None) is not None:
                    self._halt(node)
                return 200, self._operation(parent, {"@type": EMPTY_TYPE})
        if kind == "nodes" and rid:
            if name not in self.nodes:
                return _error(404, f"Resource '{name}' was not found")
            if method == "GET":
                return 200, self.nodes[name]
            if method == "DELETE":
                del self.nodes[name]
                self._halt(name)
                return 200, self._operation(parent, {"@type": EMPTY_TYPE})
            if method == "PATCH":
                if query.get("updateMask") != "labels":
                    return _error(400, f"fake serves updateMask=labels only, not "
                                       f"{query.get('updateMask')!r}", "INVALID_ARGUMENT")
                self.nodes[name]["labels"] = dict((body or {}).get("labels") or {})
                return 200, self._operation(parent, {"@type": NODE_TYPE, **self.nodes[name]})
        return _error(404, f"no route {method} {path}")

    def _create_queued(self, parent: str, query: dict, body: dict):
        rid = query.get("queuedResourceId")
        name = f"{parent}/queuedResources/{rid}"
        if name in self.queued:
            return _error(409, f"Resource '{name}' already exists", "ALREADY_EXISTS")
        resource = {**body, "name": name, "createTime": "2026-01-01T00:00:00Z",
                    "state": {"state": "CREATING"}}
        self.queued[name] = resource
        self.scripts[name] = list(self.states)
        self.suspended_by.pop(name, None)
        return 200, self._operation(parent, {"@type": QR_TYPE, **resource})

    def _advance(self, name: str) -> dict:
        resource = self.queued[name]
        script = self.scripts[name]
        state = script.pop(0) if len(script) > 1 else script[0]
        resource["state"] = {"state": state}
        if state in ("SUSPENDING", "SUSPENDED"):
            resource["state"]["stateInitiator"] = self.suspended_by.get(name, "SERVICE")
        if state == "FAILED":
            resource["state"]["failedData"] = {"error": {"code": 8, "message": self.failure}}
        if state == "ACTIVE" and self._node_name(name) not in self.nodes:
            self._make_node(name)
        return resource

    def _node_name(self, queued_name: str) -> str:
        resource = self.queued.get(queued_name) or {}
        spec = ((resource.get("tpu") or {}).get("nodeSpec") or [{}])[0]
        parent = queued_name.split("/queuedResources/")[0]
        return f"{parent}/nodes/{spec.get('nodeId', '')}"

    def _make_node(self, queued_name: str) -> None:
        spec = self.queued[queued_name]["tpu"]["nodeSpec"][0]
        name = self._node_name(queued_name)
        spot = "spot" in self.queued[queued_name]
        self.nodes[name] = {**spec["node"], "name": name, "state": "READY",
                            "queuedResource": queued_name,
                            "schedulingConfig": {"spot": True} if spot else {},
                            "networkEndpoints": [{"ipAddress": "10.0.0.2", "port": 8470}]}
        if self.on_boot is not None:
            self.on_boot(name)

    def _operation(self, parent: str, response: dict) -> dict:
        name = f"{parent}/operations/operation-{uuid.uuid4().hex[:12]}"
        op = {"name": name, "done": True, "response": response,
              "metadata": {"@type": META_TYPE, "verb": "create", "apiVersion": "v2"}}
        self.operations[name] = op
        return op


def _error(code: int, message: str, status: str = ""):
    status = status or {400: "INVALID_ARGUMENT", 404: "NOT_FOUND"}.get(code, "UNKNOWN")
    return code, {"error": {"code": code, "message": message, "status": status}}
