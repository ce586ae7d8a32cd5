"""CandidateApproval: the standard provider's ApprovalOperator between the quality gate and the
promotion. Imported by the DAG file at parse time (no TensorFlow; tasks only inside methods).

- Skipped (AirflowSkipException before any request is written) unless the run asked for
  approval and the gate passed: then the DAG runs as without it.
- Otherwise it writes the request, subject and Markdown body from the gate's result (the
  candidate's metrics next to the champion's, a link to the run's bertflow page), and waits:
  from Airflow 3.3 in `awaiting_input`, holding no worker slot. The run's
  approval_timeout_minutes becomes the operator's response_timeout; when it passes, the
  scheduler's timeout sweep answers with the default, Reject, and resumes the task with
  `timedout` set.
- An answer is recorded, not acted on: unlike ApprovalOperator it does not skip what follows
  on Reject, so the promote task always runs and writes why the champion stayed.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import quote

from airflow.providers.standard.operators.hitl import ApprovalOperator, HITLOperator
from airflow.sdk.exceptions import AirflowSkipException

from bertflow_airflow.worker_operator import run_page_path


class CandidateApproval(ApprovalOperator):
    def __init__(self, *, gate_task_id: str, **kwargs):
        # subject and body are placeholders until execute() renders them from the gate.
        super().__init__(subject="Promote the candidate model?", defaults=self.REJECT,
                         **kwargs)
        self.gate_task_id = gate_task_id

    def execute(self, context):
        from tasks.steps.promote import approval_request

        gate = context["ti"].xcom_pull(task_ids=self.gate_task_id)
        if not gate.get("require_approval"):
            raise AirflowSkipException("require_approval is off: the gate decides alone")
        if not gate.get("passed"):
            raise AirflowSkipException(f"the gate did not pass ({gate.get('reason')}): "
                                       f"nothing to approve")
        self.subject, self.body = approval_request(
            gate, run_page_url(gate["run_uri"]), compare_page_url(gate))
        self.response_timeout = timedelta(minutes=gate["approval_timeout_minutes"])
        self.log.info("Asking for approval: %s", self.subject)
        return super().execute(context)

    def execute_complete(self, context, event: dict[str, Any]) -> dict[str, Any]:
        # HITLOperator's checks and payload without ApprovalOperator's downstream skip.
        payload = HITLOperator.execute_complete(self, context, event)
        approved = payload["chosen_options"] == [self.APPROVE]
        user = payload.get("responded_by_user") or {}
        answer = {"approved": approved, "timed_out": bool(event.get("timedout")),
                  "by": str(user.get("name") or user.get("id") or ""),
                  "at": payload["responded_at"].isoformat()
                  if payload.get("responded_at") else ""}
        self.log.info("Approval answer: %s", answer)
        return answer


def compare_page_url(gate: dict) -> str:
    """The bertflow compare page of the candidate's run and the champion's ("" when the
    champion's run is unknown)."""
    page = run_page_url(gate["run_uri"])
    if not gate.get("champion_run") or "/bertflow/runs/" not in page:
        return ""
    base, candidate = page.split("/bertflow/runs/", 1)
    return (f"{base}/bertflow/compare?run={quote(candidate, safe='/')}"
            f"&run={quote(gate['champion_run'], safe='/')}")


def run_page_url(run_uri: str) -> str:
    """The run's bertflow page under the api-server's base URL (relative when unset)."""
    try:
        from airflow.configuration import conf

        base = conf.get("api", "base_url", fallback="/") or "/"
    except ImportError:  # a worker with the task SDK only
        base = "/"
    return base.rstrip("/") + "/" + run_page_path(run_uri)
