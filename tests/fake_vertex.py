"""A fake Vertex AI JobService over real HTTP, for the real `JobServiceClient` (REST
transport) to talk to: point it here with `BERTFLOW_VERTEX_ENDPOINT=fake.endpoint`.

It serves the REST paths of google-cloud-aiplatform's v1 JobService for CustomJobs:

- `POST /v1/projects/*/locations/*/customJobs`: the body must parse as a CustomJob (unknown
  fields rejected); stored with a new name, create_time and the first state of its script.
- `GET /v1/{name}`: the job; every GET moves it one state along its script (it stays on the
  last state). A script entry is a state name, or (state, error message).
- `POST /v1/{name}:cancel`: recorded in `cancels`; an alive job becomes JOB_STATE_CANCELLED,
  a finished one answers FAILED_PRECONDITION as Vertex AI does.
- `GET /v1/projects/*/locations/*/customJobs?filter=...`: jobs matching `labels.K="V"` and
  `state="S"` terms joined by AND; `list_error = (code, status, message)` makes it fail
  (e.g. 403 PERMISSION_DENIED, for the preflight).
- `get_errors`: that many GETs of a job answer 503 UNAVAILABLE first (a flaky API).

Every request (method, path, body) is kept in `requests`, so tests can scan what was sent.
"""
from __future__ import annotations

import datetime as dt
import re
import threading
import urllib.parse

from google.cloud.aiplatform_v1 import CustomJob
from google.protobuf import json_format

from loopback_http import LoopbackServer, QuietHandler

ALIVE = {"JOB_STATE_QUEUED", "JOB_STATE_PENDING", "JOB_STATE_RUNNING"}
JOBS = re.compile(r"^/v1/(projects/[^/]+/locations/[^/]+)/customJobs$")
JOB = re.compile(r"^/v1/(projects/[^/]+/locations/[^/]+/customJobs/[^/:]+)(:cancel)?$")


class FakeVertex(LoopbackServer):
    def __init__(self):
        self.jobs: dict[str, CustomJob] = {}
        self.scripts: dict[str, list] = {}
        # The script each new job follows.
        self.script: list = ["JOB_STATE_PENDING", "JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED"]
        self.requests: list[tuple[str, str, str]] = []
        self.cancels: list[str] = []
        self.list_error: tuple[int, str, str] | None = None
        self.get_errors = 0
        self.lock = threading.Lock()
        self._next_id = 1000
        super().__init__(self._handler())

    def state(self, name: str) -> str:
        with self.lock:
            return self.jobs[name].state.name

    def created(self) -> list[str]:
        with self.lock:
            return list(self.jobs)

    # --- service --------------------------------------------------------------------------
    def _set_state(self, job: CustomJob, entry) -> None:
        state, message = (entry, "") if isinstance(entry, str) else entry
        job.state = state
        if message:
            job.error = {"code": 13, "message": message}

    def create(self, location: str, body: str) -> tuple[int, dict]:
        try:
            job = CustomJob.wrap(json_format.Parse(body, CustomJob.pb()()))
        except json_format.ParseError as err:
            return 400, _error(400, "INVALID_ARGUMENT", f"not a CustomJob: {err}")
        if not job.display_name or not job.job_spec.worker_pool_specs:
            return 400, _error(400, "INVALID_ARGUMENT", "display_name and worker pools needed")
        with self.lock:
            self._next_id += 1
            job.name = f"{location}/customJobs/{self._next_id}"
            job.create_time = dt.datetime.now(dt.timezone.utc)
            self.scripts[job.name] = list(self.script)
            self._set_state(job, self.scripts[job.name][0])
            self.jobs[job.name] = job
            return 200, _json(job)

    def get(self, name: str) -> tuple[int, dict]:
        with self.lock:
            if self.get_errors > 0:
                self.get_errors -= 1
                return 503, _error(503, "UNAVAILABLE", "the service is currently unavailable")
            job = self.jobs.get(name)
            if job is None:
                return 404, _error(404, "NOT_FOUND", f"{name} not found")
            script = self.scripts[name]
            if job.state.name != "JOB_STATE_CANCELLED" and len(script) > 1:
                script.pop(0)
                self._set_state(job, script[0])
            return 200, _json(job)

    def cancel(self, name: str) -> tuple[int, dict]:
        with self.lock:
            self.cancels.append(name)
            job = self.jobs.get(name)
            if job is None:
                return 404, _error(404, "NOT_FOUND", f"{name} not found")
            if job.state.name not in ALIVE:
                return 400, _error(400, "FAILED_PRECONDITION", f"{name} is {job.state.name}")
            job.state = "JOB_STATE_CANCELLED"
            job.error = {"code": 1, "message": "CANCELED"}
            return 200, {}

    def list(self, location: str, query: dict) -> tuple[int, dict]:
        if self.list_error:
            return self.list_error[0], _error(*self.list_error)
        terms = [t.strip() for t in (query.get("filter", [""])[0]).split(" AND ") if t.strip()]
        wanted = []
        for term in terms:
            match = re.fullmatch(r'(labels\.[\w-]+|state)\s*=\s*"?([^"]*)"?', term)
            if not match:
                return 400, _error(400, "INVALID_ARGUMENT", f"unsupported filter {term!r}")
            wanted.append(match.groups())
        with self.lock:
            found = []
            for name, job in self.jobs.items():
                if not name.startswith(location + "/"):
                    continue
                values = {f"labels.{k}": v for k, v in job.labels.items()}
                values["state"] = job.state.name
                if all(values.get(key) == value for key, value in wanted):
                    found.append(_json(job))
            return 200, {"customJobs": found}

    def _handler(self):
        fake = self

        class Handler(QuietHandler):
            def _route(self, method: str) -> None:
                url = urllib.parse.urlsplit(self.path)
                body = self.body().decode()
                with fake.lock:
                    fake.requests.append((method, self.path, body))
                jobs, job = JOBS.match(url.path), JOB.match(url.path)
                if method == "POST" and jobs:
                    self.reply_json(*fake.create(jobs.group(1), body))
                elif method == "GET" and jobs:
                    self.reply_json(*fake.list(jobs.group(1), urllib.parse.parse_qs(url.query)))
                elif method == "POST" and job and job.group(2):
                    self.reply_json(*fake.cancel(job.group(1)))
                elif method == "GET" and job and not job.group(2):
                    self.reply_json(*fake.get(job.group(1)))
                else:
                    self.reply_json(404, _error(404, "NOT_FOUND", f"no route {method} {url.path}"))

            def do_GET(self):  # noqa: N802
                self._route("GET")

            def do_POST(self):  # noqa: N802
                self._route("POST")

        return Handler


def _json(job: CustomJob) -> dict:
    return json_format.MessageToDict(CustomJob.pb(job))


def _error(code: int, status: str, message: str) -> dict:
    return {"error": {"code": code, "status": status, "message": message}}
