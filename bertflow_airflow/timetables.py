"""BackfillOnlyTimetable: data intervals for backfills, and no run of its own.

Airflow backfills only DAGs with a periodic timetable (airflow/models/backfill.py:
`dag.timetable.periodic`), and the UI's Backfill option follows the same flag
(`is_backfillable`). A paused periodic sibling DAG does not help: the scheduler queues no
task of a paused DAG, backfill runs included (scheduler_job_runner: `~DagModel.is_paused`;
DagRun.get_queued_dag_runs_to_set_running). This timetable is periodic, so a backfill over
past dates gets one run per cron interval, but it never proposes a run to the scheduler.

Both callers go through `next_dagrun_info`: the scheduler with the DAG's own restriction
(catchup off on bert_finetune, no end date), backfill creation with
`TimeRestriction(from, to, catchup=True)` (serialization/definitions/dag.py,
iter_dagrun_infos_between). Only the second gets intervals.

A custom timetable must be registered by a plugin (plugins/bertflow_plugin.py lists it) so
the scheduler and api-server can deserialize the DAG.
"""
from __future__ import annotations

from airflow.timetables.base import DagRunInfo, DataInterval, TimeRestriction
from airflow.timetables.interval import CronDataIntervalTimetable


class BackfillOnlyTimetable(CronDataIntervalTimetable):
    """Cron data intervals for backfills over past dates; never scheduled by itself."""

    @property
    def summary(self) -> str:
        return f"backfills only ({self._expression} intervals)"

    def __init__(self, cron: str, timezone="UTC") -> None:
        super().__init__(cron, timezone)
        self.description = (f"Never runs by itself; a backfill gets one run per "
                            f"{self._expression} interval")

    def next_dagrun_info(self, *, last_automated_data_interval: DataInterval | None,
                         restriction: TimeRestriction) -> DagRunInfo | None:
        if not restriction.catchup or restriction.latest is None:
            return None  # the scheduler asking for the DAG's next run
        return super().next_dagrun_info(last_automated_data_interval=last_automated_data_interval,
                                        restriction=restriction)
