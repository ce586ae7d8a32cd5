"""bert_sweep: one experiment over a search space of bert_finetune's config.

validate (every trial's config, before any compute) -> prepare_data (once) -> tokenize (once
per distinct max_seq_length) -> trial[i] (mapped, labelled by its values: wait_for_slot ->
[provision] train [release]) -> pick_best (by the validation gate_metric) -> evaluate (the
best trial, on the test rows: the only trial that reads them) -> export -> gate_eval -> gate ->
[approval] -> promote.

Trials are ranked on validation rows (docs/experiments.md, Three roles for data). With
`sweep_pruning` (median or asha, tasks/runs/pruning.py) a trial that validates worse than the
others at an evaluation stops there; its train task succeeds, named "(pruned)" in the grid,
with the reason in its log and on the sweep's page.

The trigger form holds every bert_finetune Param (the base config) plus `search_space` (a
grid or a seeded random space over the training fields, tasks/runs/sweep_space.py) and
`max_parallel_trials`. A trial waits for a slot before it provisions its workers on the run's
backend: at most max_parallel_trials trials hold workers at once (tasks/runs/sweep.py,
may_start). Trials and the sweep are run folders under runs/bert_sweep/, so the bertflow page
lists and compares them. A sweep over one value is the plain bert_finetune run of that config.
Thin wiring only, as in bert_finetune: nothing heavy is imported at parse time.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import Param, dag, task, task_group

from bertflow_airflow import run_tasks
from bertflow_airflow.worker_operator import LABEL_TEMPLATE, WorkerStepOperator
from tasks.params_form import DRAFT, param_schemas  # pydantic only; no TensorFlow
from tasks.runs.pruning import RULES as PRUNING_RULES
from tasks.runs.sweep_space import MAX_TRIALS

DAG_ID = "bert_sweep"
SWEEP_SECTION = "Sweep"
# States of a trial's release (its teardown) after which the trial holds no workers.
FINISHED = ["success", "failed", "skipped", "upstream_failed", "removed"]

SWEEP_PARAMS = {
    "search_space": Param(
        {"grid": {"learning_rate": [3e-5, 5e-5]}}, type="object", **DRAFT,
        title="Search space",
        description='A grid, every combination: {"grid": {"learning_rate": [3e-5, 5e-5], '
                    '"seed": [0, 1]}}; or seeded random trials: {"random": {"learning_rate": '
                    '{"low": 1e-5, "high": 1e-4, "log": true}, "per_replica_batch_size": '
                    f'[16, 32]}}, "trials": 8, "seed": 0}}. Training fields only; at most '
                    f"{MAX_TRIALS} trials. See docs/experiments.md."),
    "max_parallel_trials": Param(
        2, type="integer", **DRAFT, minimum=1, maximum=MAX_TRIALS, title="Trials at once",
        description="How many trials hold workers at the same time; the others wait."),
    "sweep_pruning": Param(
        "none", enum=list(PRUNING_RULES), **DRAFT, title="Pruning",
        description="Stop a trial early when it validates worse than the others at an "
                    "evaluation during training: median (below the median of the trials at "
                    "that step) or asha (not in the top third at a rung). Needs "
                    "eval_every_steps or eval_every_epoch. See docs/experiments.md."),
}


@dag(
    dag_id=DAG_ID,
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    params={**SWEEP_PARAMS,
            **{name: Param(**schema) for name, schema in param_schemas().items()}},
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30)},
    tags=["bertflow", "tensorflow", "sweep"],
    doc_md=__doc__,
)
def bert_sweep():
    @task(retries=0, multiple_outputs=True)
    def validate(**context) -> dict:
        """Every trial's whole config (errors name the trial and field), then the run checks
        once on the shared config and the memory check per trial; writes the folders."""
        from tasks.provision import memory_budget
        from tasks.runs import sweep
        from tasks.training import memory

        params = context["params"]
        plan = sweep.plan(run_tasks.run_values(context, exclude=tuple(SWEEP_PARAMS)),
                          params["search_space"], params["sweep_pruning"])
        shared, ctx = run_tasks.checked_run(context, plan.shared)
        model_config = memory.readable_config(shared)
        for trial in plan.trials:
            trial.cfg.base_model = shared.base_model  # the pinned or staged checkpoint
            trial.cfg.lower_case = shared.lower_case  # pinned from the checkpoint
            memory_budget.check_config(trial.cfg, model_config)
        print(f"{len(plan.trials)} trials, at most {params['max_parallel_trials']} at once: "
              + "; ".join(t.label for t in plan.trials))
        return sweep.init_sweep(plan, ctx, params["max_parallel_trials"])

    @task
    def share_data(sweep_uri: str) -> list[dict]:
        """The data manifest into every trial; the tokenize instances, one per length."""
        from tasks.runs import sweep

        return [{"run_uri": lead["run_uri"], "map_label": lead["label"]}
                for lead in sweep.share_data(sweep_uri)]

    @task
    def share_tokens(sweep_uri: str) -> list[dict]:
        from tasks.runs import sweep

        return sweep.share_tokens(sweep_uri)

    # Reschedule mode holds no worker slot while waiting. Airflow 3.3 can fail a poke whose
    # executor report the scheduler reads after it re-queued the next poke (apache/airflow
    # #71172, open): a 20 s interval keeps that rare on a loaded scheduler, and retries absorb
    # it. A wait that fails for good ends its trial unstarted; the others go on.
    @task.sensor(poke_interval=20, mode="reschedule", timeout=timedelta(days=7).total_seconds(),
                 retries=3, retry_delay=timedelta(seconds=5),
                 map_index_template=run_tasks.LABEL_TEMPLATE)
    def wait_for_slot(run_uri: str, label: str, **context) -> bool:
        """Reschedules itself until fewer than max_parallel_trials earlier trials are still
        to finish (tasks/runs/sweep.py, may_start)."""
        from tasks.runs import sweep

        run_tasks.label_map_index(label)
        ti = context["ti"]
        states = ti.get_task_states(dag_id=ti.dag_id, task_ids=["trial.release"],
                                    run_ids=[ti.run_id]).get(ti.run_id, {})
        finished = sum(1 for index in range(ti.map_index)
                       if states.get(f"trial.release_{index}") in FINISHED)
        cap = context["params"]["max_parallel_trials"]
        ready = sweep.may_start(ti.map_index + 1, finished, cap)
        print(f"trial {ti.map_index + 1}: {ti.map_index - finished} earlier trial(s) still to "
              f"finish, at most {cap} at once: {'starting' if ready else 'waiting'}")
        return ready

    @task_group(group_id="trial")
    def trial(run_uri: str, label: str):
        slot = wait_for_slot(run_uri, label)
        provisioned = run_tasks.provision.override(
            map_index_template=run_tasks.LABEL_TEMPLATE)(run_uri, label)
        trained = WorkerStepOperator(task_id="train", step="train", run_uri=run_uri,
                                     map_label=label, distributed=True,
                                     map_index_template=LABEL_TEMPLATE)
        released = run_tasks.release.override(
            map_index_template=run_tasks.LABEL_TEMPLATE)(run_uri, label)
        slot >> provisioned >> trained >> released
        released.as_teardown(setups=provisioned)

    # The best of the trials that trained to their end, whatever happened to the others (it
    # fails if none did); not after a failed validate (no success upstream at all).
    @task(trigger_rule="all_done_min_one_success", retries=0)
    def pick_best(sweep_uri: str) -> str:
        from tasks.runs import sweep

        result = sweep.pick_best(sweep_uri)
        for row in result["trials"]:
            value = row["validation"] if row["validation"] is not None else "not trained"
            print(f"trial {row['index']} ({row['label']}): validation {result['metric']} "
                  f"{value}{'; ' + row['pruned'] if row['pruned'] else ''}")
        best = result["best"]
        print(f"best: trial {best['index']} ({best['label']}), {best['run_uri']}")
        return best["run_uri"]

    plan = validate()
    sweep_uri = plan["sweep_uri"]
    data_manifest = WorkerStepOperator(task_id="prepare_data", step="data", run_uri=sweep_uri)
    leads = share_data(sweep_uri)
    tokenized = WorkerStepOperator.partial(
        task_id="tokenize", step="tokenize",
        map_index_template=LABEL_TEMPLATE).expand_kwargs(leads)
    trial_args = share_tokens(sweep_uri)
    trials = trial.expand_kwargs(trial_args)
    best_run = pick_best(sweep_uri)
    data_manifest >> leads
    tokenized >> trial_args
    trials >> best_run
    # The best trial's test evaluation, in one process of its own (its trial's workers are
    # released): the sweep's only read of the test rows before the gate's.
    evaluated = WorkerStepOperator(task_id="evaluate", step="evaluate", run_uri=best_run)
    exported = WorkerStepOperator(task_id="export", step="export", run_uri=best_run)
    evaluated >> exported
    run_tasks.gate_approve_promote(best_run, exported.output)


bert_sweep()
