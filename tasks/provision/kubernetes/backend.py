"""`provisioner: kubernetes`: each worker step runs as Indexed Jobs behind a headless Service
(objects: tasks/provision/kubernetes/render.py) on any cluster (GKE, EKS, ...).

Not Airflow's KubernetesJobOperator: it fetches logs only after the Job ends, renames the
Job (which changes pod hostnames) and leaves the Job running when a deferred task is killed.
The controller here uses the plain `kubernetes` client (through the cncf-kubernetes
provider's hook for `k8s_conn_id`): it creates the step's objects, waits for scheduling,
streams every pod's log live with a `[role:index]` prefix, fails fast with the failing pod's
reason and last lines, and always deletes what it created, with a propagation policy (a Job
deleted without one leaves its pods running).

Imported only when this backend is chosen; the client itself is imported on first use.
"""
from __future__ import annotations

import collections
import json
import os
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Callable

from tasks.io import credentials
from tasks.config import RunConfig
from tasks.errors import WorkerError
from tasks.provision.kubernetes import render
from tasks.provision.kubernetes.pod_logs import PodLog
from tasks.provision.attempts import WorkerLost, outcome_of_exit
from tasks.provision.backends import Backend, Log, check_remote
from tasks.provision.spec import WorkerSpec
from tasks.provision.worker_logs import StepLogs, attempt_of, log_uris
from tasks.runs.runlayout import RunContext

PROPAGATION = "Background"  # the Job's pods go with it (the default for Jobs orphans them)
# Container states that will not fix themselves within a step's patience.
FATAL_WAITING = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                 "CreateContainerConfigError", "CreateContainerError")
# Services and Secrets without Jobs are swept only after this long: a controller creates the
# Service a moment before its Jobs.
SWEEP_GRACE = timedelta(minutes=5)

ClientFactory = Callable[[RunConfig], object]


def default_client(cfg: RunConfig):
    """An ApiClient: the Airflow connection `k8s_conn_id` (cncf-kubernetes provider's
    KubernetesHook: in_cluster, kube_config_path or kube_config extras); without one the
    pod's service account (in-cluster), else ~/.kube/config ($KUBECONFIG)."""
    if cfg.k8s_conn_id:
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        return KubernetesHook(kubernetes_conn_id=cfg.k8s_conn_id).api_client
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        # $KUBECONFIG read now: the client reads it once, when first imported.
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None,
                                client_configuration=configuration)
    return client.ApiClient(configuration)


class _Api:
    """The two API groups the backend uses, and deletes that tolerate what is gone."""

    def __init__(self, api_client):
        from kubernetes import client

        self.client = client
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)

    def _ignore_missing(self, call, *args, **kwargs):
        try:
            return call(*args, **kwargs)
        except self.client.ApiException as err:
            if err.status != 404:
                raise
            return None

    def delete_selected(self, namespace: str, label_selector: str,
                        pods: bool = False) -> dict[str, int]:
        """Delete every Job, Secret and Service (and, for release, pod) with these labels.
        Jobs go with a propagation policy, so their pods go too."""
        options = self.client.V1DeleteOptions(propagation_policy=PROPAGATION)
        kinds = [("jobs", self.batch.list_namespaced_job, self.batch.delete_namespaced_job),
                 ("secrets", self.core.list_namespaced_secret,
                  self.core.delete_namespaced_secret),
                 ("services", self.core.list_namespaced_service,
                  self.core.delete_namespaced_service)]
        if pods:
            kinds.append(("pods", self.core.list_namespaced_pod,
                          self.core.delete_namespaced_pod))
        counts = {}
        for kind, list_call, delete_call in kinds:
            items = list_call(namespace, label_selector=label_selector).items
            for item in items:
                self._ignore_missing(delete_call, item.metadata.name, namespace,
                                     propagation_policy=PROPAGATION, body=options)
            counts[kind] = len(items)
        return counts


class KubernetesBackend(Backend):
    name = "kubernetes"
    render_format = "yaml"

    def __init__(self, client_factory: ClientFactory | None = None, *,
                 poll_seconds: float = 2.0, grace_seconds: float = 60.0,
                 settle_seconds: float = 3.0,
                 base_port: int = render.BASE_PORT, _shares_host_disk: bool = False):
        # client_factory: a seam for tests and embedders (cfg -> ApiClient).
        # _shares_host_disk: test-only; the equivalence tests run the "pods" on this host,
        # where a local run folder is visible. Never set it for a real cluster.
        self._client_factory = client_factory or default_client
        self.poll_seconds = poll_seconds
        self.grace_seconds = grace_seconds
        # After the first failed pod, how long to watch the others before naming the root
        # cause (JobController._fail_root_cause).
        self.settle_seconds = settle_seconds
        self.base_port = base_port
        self._shares_host_disk = _shares_host_disk

    def api(self, cfg: RunConfig) -> _Api:
        return _Api(self._client_factory(cfg))

    # --- Backend contract -----------------------------------------------------------------
    def check(self, cfg: RunConfig, ctx: RunContext, dry_run: bool = False) -> list[str]:
        render.check_accelerators(cfg)
        return [] if self._shares_host_disk else check_remote(cfg, dry_run)

    def preflight_checks(self, cfg: RunConfig, ctx: RunContext) -> list:
        from tasks.provision.kubernetes import preflight

        return preflight.checks(cfg, ctx, self)

    def render(self, cfg: RunConfig, ctx: RunContext, spec: WorkerSpec) -> list[dict]:
        # The connections' names only: the dry run never reads a credential.
        keys = credentials.connection_env_names(cfg)
        return render.render_objects(cfg, ctx, spec, secret_keys=keys,
                                     base_port=self.base_port)

    def dry_run_notes(self, cfg: RunConfig, ctx: RunContext) -> list[str]:
        keys = credentials.connection_env_names(cfg)
        if not keys:
            return []
        return [f"The pods read the run's Airflow connections from Secret "
                f"{render.connections_secret_name(ctx)}; create it before applying, each "
                f"variable holding its connection (JSON or URI): "
                f"{render.connections_secret_command(cfg, ctx, keys)}"]

    def controller(self, cfg: RunConfig, ctx: RunContext, spec: WorkerSpec, *, log: Log,
                   secrets: dict[str, str]) -> "JobController":
        self.check(cfg, ctx)
        return JobController(self, cfg, ctx, spec, log=log, secrets=secrets)

    def release(self, cfg: RunConfig, ctx: RunContext, log: Log = print) -> dict:
        """Delete everything of the run by its labels, whatever its controllers did. Pods
        still there (their controller died) first have their logs kept in the run folder."""
        api = self.api(cfg)
        kept = _keep_pod_logs(api, cfg, ctx, log)
        counts = api.delete_selected(cfg.k8s_namespace, render.run_selector(ctx), pods=True)
        if any(counts.values()):
            log(f"[cluster] released {counts} in namespace {cfg.k8s_namespace}")
        return {"namespace": cfg.k8s_namespace, "selector": render.run_selector(ctx),
                "deleted": counts, "kept_logs": kept}

    def sweep(self, cfg: RunConfig, log: Log = print) -> list[str]:
        """Delete bertflow objects of steps that no longer run: steps whose Jobs all finished
        (or outlived their deadline), and Services, Secrets and pods whose Jobs are gone (older
        than SWEEP_GRACE). A step with an active Job is left alone."""
        api = self.api(cfg)
        ns = cfg.k8s_namespace
        managed = render.selector({render.MANAGED_BY: render.MANAGER})
        now = datetime.now(timezone.utc)
        jobs = api.batch.list_namespaced_job(ns, label_selector=managed).items
        steps: dict[tuple, list] = collections.defaultdict(list)
        for job in jobs:
            steps[_step_key(job)].append(job)
        removed = []
        options = api.client.V1DeleteOptions(propagation_policy=PROPAGATION)
        live_steps, over_steps = set(), set()
        for key, step_jobs in steps.items():
            if any(not _job_over(job, now) for job in step_jobs):
                live_steps.add(key)
                continue
            over_steps.add(key)
            for job in step_jobs:
                api._ignore_missing(api.batch.delete_namespaced_job, job.metadata.name, ns,
                                    propagation_policy=PROPAGATION, body=options)
                removed.append(f"job/{job.metadata.name}")
        for kind, list_call, delete_call in (
                ("secret", api.core.list_namespaced_secret, api.core.delete_namespaced_secret),
                ("service", api.core.list_namespaced_service,
                 api.core.delete_namespaced_service),
                ("pod", api.core.list_namespaced_pod, api.core.delete_namespaced_pod)):
            for item in list_call(ns, label_selector=managed).items:
                created = item.metadata.creation_timestamp
                key = _step_key(item)
                if key in live_steps or (key not in over_steps and created
                                         and now - created < SWEEP_GRACE):
                    continue
                api._ignore_missing(delete_call, item.metadata.name, ns,
                                    propagation_policy=PROPAGATION, body=options)
                removed.append(f"{kind}/{item.metadata.name}")
        for name in removed:
            log(f"[sweep] deleted {name} in namespace {ns}")
        return removed


def _keep_pod_logs(api: _Api, cfg: RunConfig, ctx: RunContext, log: Log) -> list[str]:
    """Write the whole log of every pod of the run still on the cluster (its controller
    died, so nothing else writes these files) to the run folder; the URIs written."""
    from tasks.io import storage

    kept = []
    for pod in api.core.list_namespaced_pod(cfg.k8s_namespace,
                                            label_selector=render.run_selector(ctx)).items:
        meta = pod.metadata
        labels = meta.labels or {}
        index = (meta.annotations or {}).get(render.COMPLETION_INDEX) or \
            labels.get(render.COMPLETION_INDEX)
        if not (labels.get(render.STEP) and labels.get(render.ROLE) and index):
            continue
        env = {e.name: e.value for c in (pod.spec.containers if pod.spec else ())
               if c.name == render.CONTAINER for e in c.env or ()}
        uri, copies = log_uris(ctx.run_uri, labels[render.STEP], labels[render.ROLE],
                               int(index), attempt_of(env))
        try:
            # Raw bytes: the client would otherwise deserialize the text as a Python literal.
            resp = api.core.read_namespaced_pod_log(meta.name, cfg.k8s_namespace,
                                                    container=render.CONTAINER,
                                                    _preload_content=False)
            text = resp.data.decode("utf-8", errors="replace")
            text = text if not text or text.endswith("\n") else text + "\n"
            for target in (uri, *copies):
                storage.write_text(target, text)
        except Exception as err:  # noqa: BLE001 (a pod that never started has no log)
            log(f"[cluster] no log kept for pod {meta.name}: {str(err).splitlines()[0][:200]}")
            continue
        kept.append(uri)
    return kept


def _step_key(obj) -> tuple:
    labels = obj.metadata.labels or {}
    return labels.get(render.RUN_HASH), labels.get(render.STEP)


def _job_over(job, now: datetime) -> bool:
    """Finished (Complete/Failed), or running past its activeDeadlineSeconds."""
    for cond in job.status.conditions or () if job.status else ():
        if cond.type in ("Complete", "Failed") and cond.status == "True":
            return True
    start = (job.status.start_time if job.status else None) or job.metadata.creation_timestamp
    deadline = job.spec.active_deadline_seconds
    return bool(start and deadline and now > start + timedelta(seconds=deadline))


class JobController:
    """Runs one WorkerSpec as the step's Service, Secret and Jobs. `run()` blocks; `stop()`
    may be called from any thread (Airflow's on_kill)."""

    def __init__(self, backend: KubernetesBackend, cfg: RunConfig, ctx: RunContext,
                 spec: WorkerSpec, *, log: Log, secrets: dict[str, str]):
        self.backend = backend
        self.cfg = cfg
        self.ctx = ctx
        self.spec = spec
        self.log = log
        self._secrets = dict(secrets or {})  # into the Secret only; never logged
        self.api: _Api | None = None
        self.selector = render.step_selector(ctx, spec.step)
        self._stopped = threading.Event()
        self.finished = threading.Event()
        self._lock = threading.RLock()
        self._logs: dict[str, PodLog] = {}
        self.running_at: float | None = None  # every pod running (attempts.py)
        self._requested_at = time.time()  # no pod of this attempt ran before
        # Every pod's log in the run folder (worker_logs), kept before the pods are deleted.
        self.logs = StepLogs(ctx.run_uri, spec.step, log, attempt=attempt_of(spec.env))

    # --- public ---------------------------------------------------------------------------
    def run(self) -> None:
        self.api = self.backend.api(self.cfg)
        try:
            with self._lock:
                self._clear_leftovers()
                if not self._stopped.is_set():
                    self._create()
            self._watch()
        finally:
            self.finished.set()
            self._teardown()

    def stop(self) -> None:
        """Delete every object of the step (run() then raises)."""
        self._stopped.set()
        with self._lock:
            if self.api is not None:
                self._teardown()

    # --- internals ------------------------------------------------------------------------
    def _teardown(self) -> None:
        self.logs.flush()  # what the pods said so far is kept even if deleting hangs
        try:
            self.api.delete_selected(self.cfg.k8s_namespace, self.selector)
        except Exception as err:  # noqa: BLE001 (the release step deletes by label again)
            self.log(f"[cluster] could not delete the {self.spec.step} objects ({err}); the "
                     f"release step retries by label {self.selector}")
        deadline = time.monotonic() + 2  # the last lines stopping pods still write
        for stream in list(self._logs.values()):
            stream.thread.join(timeout=max(0.0, deadline - time.monotonic()))
            stream.close()
        self.logs.close()

    def _clear_leftovers(self) -> None:
        """A retry: objects of a dead earlier attempt share our names; delete and wait."""
        ns = self.cfg.k8s_namespace
        if not any(self.api.delete_selected(ns, self.selector).values()):
            return
        self.log(f"[cluster] deleted leftovers of an earlier {self.spec.step} attempt")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if not (self.api.batch.list_namespaced_job(ns, label_selector=self.selector).items
                    or self.api.core.list_namespaced_service(
                        ns, label_selector=self.selector).items):
                return
            time.sleep(self.backend.poll_seconds)
        raise WorkerError(f"objects of an earlier {self.spec.step} attempt ({self.selector}) "
                          f"are still being deleted after 120 s; retry the task later")

    def _create(self) -> None:
        ns = self.cfg.k8s_namespace
        objects = render.render_objects(self.cfg, self.ctx, self.spec,
                                        secret_values=self._secrets,
                                        base_port=self.backend.base_port)
        service = self._create_one(self.api.core.create_namespaced_service, objects[0])
        # Re-render with the Service's uid: the Secret and Jobs go when it goes.
        objects = render.render_objects(self.cfg, self.ctx, self.spec,
                                        secret_values=self._secrets,
                                        owner_uid=service.metadata.uid,
                                        base_port=self.backend.base_port)
        for obj in objects[1:]:
            self._create_one(self.api.core.create_namespaced_secret if obj["kind"] == "Secret"
                             else self.api.batch.create_namespaced_job, obj)
        jobs = [o["metadata"]["name"] for o in objects if o["kind"] == "Job"]
        self.log(f"[cluster] created service {service.metadata.name} and job(s) "
                 f"{', '.join(jobs)} in namespace {ns}")

    def _create_one(self, call, obj: dict):
        """Create `obj`; the API server's refusal (RBAC, quota, a name taken) as a
        WorkerError that says which object and what to check."""
        try:
            return call(self.cfg.k8s_namespace, obj)
        except self.api.client.ApiException as err:
            try:
                message = json.loads(err.body or "{}").get("message") or err.reason
            except ValueError:
                message = err.reason
            raise WorkerError(
                f"cannot create {obj['kind']} {obj['metadata']['name']} in namespace "
                f"{self.cfg.k8s_namespace}: {err.status} {message} (check the identity of "
                f"k8s_conn_id / the in-cluster service account: it needs create, list and "
                f"delete on services, secrets, jobs and pods)") from None

    def _pods(self) -> dict[tuple[str, int], object]:
        found = {}
        for pod in self.api.core.list_namespaced_pod(self.cfg.k8s_namespace,
                                                     label_selector=self.selector).items:
            meta = pod.metadata
            index = (meta.annotations or {}).get(render.COMPLETION_INDEX) or \
                (meta.labels or {}).get(render.COMPLETION_INDEX)
            role = (meta.labels or {}).get(render.ROLE)
            if role is None or index is None:
                continue
            found[(role, int(index))] = pod
        return found

    def _watch(self) -> None:
        expected = self.spec.roles
        main = self.spec.main_role
        started = time.monotonic()
        schedule_deadline = started + self.cfg.schedule_timeout_seconds
        reported_unschedulable = set()
        seen: set = set()
        success_at = None
        while True:
            if self._stopped.is_set():
                raise WorkerError(f"{self.spec.step} workers stopped before finishing")
            pods = self._pods()
            self._note_running(pods)
            failed = self._failed(pods)
            if failed:
                self._fail_root_cause(failed)
            for key, pod in pods.items():
                seen.add(key)
                task = f"{key[0]}:{key[1]}"
                unscheduled = _unschedulable(pod)
                if unscheduled is not None and key not in reported_unschedulable:
                    reported_unschedulable.add(key)
                    self.log(f"[cluster] {task} (pod {pod.metadata.name}) is waiting for a "
                             f"node: {unscheduled or 'not scheduled yet'} (up to "
                             f"{self.cfg.schedule_timeout_seconds} s)")
                if time.monotonic() > schedule_deadline and _waiting_for_node(pod):
                    raise WorkerError(
                        f"{task} (pod {pod.metadata.name}) was not scheduled within "
                        f"{self.cfg.schedule_timeout_seconds} s: "
                        f"{unscheduled or 'no node was assigned'}. Add capacity (e.g. a node "
                        f"pool with the requested accelerator), lower the requests "
                        f"(worker_cpu, worker_memory, devices_per_worker), or raise "
                        f"schedule_timeout_seconds.")
            missing = [k for k in expected if k not in pods]
            gone = [k for k in missing if k in seen]
            if gone:
                role, index = gone[0]
                raise WorkerLost(f"{role}:{index} pod disappeared before the step finished "
                                 f"(its node was removed, or it was deleted outside "
                                 f"bertflow, or its Job was removed)")
            if missing and time.monotonic() > schedule_deadline:
                self._job_failure()
                role, index = missing[0]
                raise WorkerError(f"no pod for {role}:{index} was created within "
                                  f"{self.cfg.schedule_timeout_seconds} s; see `kubectl "
                                  f"describe job -n {self.cfg.k8s_namespace} "
                                  f"{render.job_name(self.ctx, self.spec.step, role)}` (quota? "
                                  f"admission webhook?)")
            main_pod = pods.get(main)
            if main_pod is not None and main_pod.status.phase == "Succeeded":
                success_at = success_at or time.monotonic()
                # MWMS workers run the program to its end too: give them the grace period.
                # ps tasks and PS-strategy workers are servers: never waited for.
                peers = [pods.get(k) for k in expected if k[0] == main[0] and k != main]
                if all(p is not None and p.status.phase == "Succeeded" for p in peers) or \
                        time.monotonic() - success_at > self.backend.grace_seconds:
                    self._drain(pods)
                    return
            self._job_failure()
            self._stopped.wait(self.backend.poll_seconds)

    def _note_running(self, pods: dict) -> None:
        """The attempt's running_at, once every pod has run: now, if this poll sees them all
        running (or done); else the latest container start their statuses report, when a pod
        ended before any poll saw them all running (a spot pod preempted within poll_seconds
        of its start: its terminated state keeps startedAt)."""
        expected = self.spec.roles
        if self.running_at is not None or any(k not in pods for k in expected):
            return
        if all(_phase(pods[k]) in ("Running", "Succeeded") for k in expected):
            self.running_at = time.time()
            return
        starts = [_started_at(pods[k]) for k in expected]
        if all(starts):  # the node's clock, kept within this attempt's span
            latest = max(start.timestamp() for start in starts)
            self.running_at = min(max(latest, self._requested_at), time.time())

    def _drain(self, pods: dict) -> None:
        """Let the finished pods' streams deliver their last lines before teardown."""
        for pod in pods.values():
            stream = self._logs.get(pod.metadata.name)
            if stream is not None and pod.status.phase in ("Succeeded", "Failed"):
                stream.thread.join(timeout=10)

    def _job_failure(self) -> None:
        """A Job that failed without a failed pod to explain it (its deadline passed)."""
        for job in self.api.batch.list_namespaced_job(self.cfg.k8s_namespace,
                                                      label_selector=self.selector).items:
            for cond in (job.status.conditions if job.status else None) or ():
                # A failed pod fails its Job too (backoffLimit 0): the pod says why, next poll.
                if cond.type == "Failed" and cond.status == "True" and \
                        cond.reason not in ("BackoffLimitExceeded", "PodFailurePolicy"):
                    raise WorkerError(f"job {job.metadata.name} failed: {cond.reason}: "
                                      f"{cond.message or ''} (activeDeadlineSeconds comes "
                                      f"from worker_timeout_minutes)")

    def _failed(self, pods: dict) -> list[tuple[str, object, str]]:
        """(task, pod, reason) of every failed pod, in role order; streams the log of every
        pod that has one."""
        failed = []
        for key, pod in pods.items():
            task = f"{key[0]}:{key[1]}"
            if _phase(pod) in ("Running", "Succeeded", "Failed") and \
                    pod.metadata.name not in self._logs:
                self._logs[pod.metadata.name] = PodLog(self, pod.metadata.name, task)
            failure = _failure(pod)
            if failure:
                failed.append((task, pod, failure))
        return failed

    def _fail_root_cause(self, failed: list) -> None:
        """Raise for the pod whose end caused the others': one killed (SIGKILL or SIGTERM,
        out of memory, evicted, preempted) before one that exited with an error, since its
        peers' collectives then fail too, possibly before its own end is reported; else the
        one that finished first (the container's finishedAt). While none was killed and other
        pods still run, watches up to `settle_seconds` for more."""
        deadline = time.monotonic() + self.backend.settle_seconds
        while not any(_killed(pod) for _, pod, _ in failed) and \
                time.monotonic() < deadline and not self._stopped.is_set():
            pods = self._pods()
            self._note_running(pods)
            failed = self._failed(pods) or failed
            if not any(_phase(pod) == "Running" for pod in pods.values()):
                break
            self._stopped.wait(min(self.backend.poll_seconds, 0.5))
        order = {id(f): i for i, f in enumerate(failed)}
        cause = min(failed, key=lambda f: (not _killed(f[1]), _finished_at(f[1]), order[id(f)]))
        self._fail(*cause, others=[f for f in failed if f is not cause])

    def _fail(self, task: str, pod, reason: str, others: list = ()) -> None:
        stream = self._logs.get(pod.metadata.name)
        tail = []
        if stream is not None:
            stream.thread.join(timeout=5)  # the last lines (the error) first
            tail = list(stream.tail)
        last = next((ln for ln in reversed(tail) if ln.strip()), "(no output)")
        after = "".join(f"; then {t} failed: {r}" for t, _, r in others)
        raise _failure_class(pod)(f"{task} (pod {pod.metadata.name}) failed: {reason}; last "
                                  f"line: {last}{after}\n--- last output of {task} ---\n" +
                                  "\n".join(tail))


# --- pod status -------------------------------------------------------------------------
def _container_status(pod):
    statuses = (pod.status.container_statuses if pod.status else None) or []
    return next((s for s in statuses if s.name == render.CONTAINER), None)


def _condition(pod, kind: str):
    conditions = (pod.status.conditions if pod.status else None) or []
    return next((c for c in conditions if c.type == kind), None)


def _failure(pod) -> str | None:
    """Why a pod has failed (or cannot start), in the platform's words; None if it has not."""
    status = pod.status
    container = _container_status(pod)
    if container is not None and container.state and container.state.waiting:
        waiting = container.state.waiting
        if waiting.reason in FATAL_WAITING:
            hint = ("check worker_image / image_registry and image_pull_secrets"
                    if "Image" in waiting.reason else "check the pod's Secret and settings")
            return f"{waiting.reason}: {waiting.message or ''} ({hint})"
    if status is None or status.phase != "Failed":
        return None
    parts = []
    if status.reason:  # e.g. Evicted, DeadlineExceeded
        parts.append(f"{status.reason}: {status.message or ''}".rstrip(": "))
    disruption = _condition(pod, "DisruptionTarget")
    if disruption is not None and disruption.status == "True":
        parts.append(f"preempted ({disruption.reason}: {disruption.message or ''})")
    terminated = container.state.terminated if container and container.state else None
    if terminated is not None:
        text = f"{terminated.reason or 'exited'} (exit code {terminated.exit_code})"
        if terminated.reason == "OOMKilled":
            text += ": out of memory; raise worker_memory or lower per_replica_batch_size"
        parts.append(text)
    return "; ".join(parts) or "failed"


# Pod status reasons of a pod its node took away: Evicted (node pressure), and graceful node
# shutdown's Terminated / NodeShutdown (Kubernetes "Node Shutdowns"; GKE spot reclaims).
LOST_REASONS = ("Evicted", "Terminated", "NodeShutdown", "Shutdown")


# Container exit codes of a process killed by a signal: 128 + SIGKILL, 128 + SIGTERM (the
# container runtime's convention). 128 + SIGABRT (134) is left out: TensorFlow aborts a worker
# whose collective failed, which is what a peer's death does to it.
KILLED_EXIT_CODES = (137, 143)


def _terminated(pod):
    container = _container_status(pod)
    return container.state.terminated if container and container.state else None


def _killed(pod) -> bool:
    """Ended from outside (a signal, the OOM killer, eviction, preemption, node shutdown),
    not as a consequence of a peer's failure."""
    terminated = _terminated(pod)
    if terminated is not None and (terminated.reason == "OOMKilled" or
                                   terminated.exit_code in KILLED_EXIT_CODES):
        return True
    disruption = _condition(pod, "DisruptionTarget")
    return (disruption is not None and disruption.status == "True") or \
        (pod.status is not None and pod.status.reason in LOST_REASONS)


def _started_at(pod) -> datetime | None:
    """When the pod's container started, running or since ended; None if it never did."""
    container = _container_status(pod)
    state = container.state if container else None
    for current in (state.running, state.terminated) if state else ():
        if current is not None and current.started_at is not None:
            return current.started_at
    return None


def _finished_at(pod) -> datetime:
    terminated = _terminated(pod)
    when = terminated.finished_at if terminated is not None else None
    return when or datetime.max.replace(tzinfo=timezone.utc)


def _phase(pod) -> str | None:
    return pod.status.phase if pod.status else None


def _failure_class(pod) -> type[WorkerError]:
    """Exit code 75: preempted and saved. A disruption (DisruptionTarget condition, node
    shutdown, eviction) without it: lost. Anything else: a failure."""
    container = _container_status(pod)
    terminated = container.state.terminated if container and container.state else None
    if terminated is not None and outcome_of_exit(terminated.exit_code) is not WorkerError:
        return outcome_of_exit(terminated.exit_code)
    disruption = _condition(pod, "DisruptionTarget")
    if (disruption is not None and disruption.status == "True") or \
            (pod.status is not None and pod.status.reason in LOST_REASONS):
        return WorkerLost
    return WorkerError


def _unschedulable(pod) -> str | None:
    """The scheduler's message for a pod it could not place ("" without one), else None."""
    cond = _condition(pod, "PodScheduled")
    if cond is not None and cond.status == "False" and cond.reason == "Unschedulable":
        return cond.message or ""
    return None


def _waiting_for_node(pod) -> bool:
    if pod.status is None or pod.status.phase != "Pending":
        return False
    cond = _condition(pod, "PodScheduled")
    return cond is None or cond.status != "True"
