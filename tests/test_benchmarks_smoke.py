"""Smoke test of the benchmark harness (no timings asserted, no data needed): each benchmark
with a smoke mode runs `--smoke` (a tiny random model, seconds) in a subprocess, writing to a
temporary folder, and its fresh results file is checked against its schema
(benchmarks/schemas/) as tests/test_benchmark_results.py checks the recorded ones. The peer
sides need .venv-peer; where it is absent they skip, saying so, and the bertflow sides run."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from lib import common, trainbench_data  # noqa: E402


def test_missing_data_is_an_error_naming_the_path_to_set(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(common, "DATA_ROOT", tmp_path / "nowhere")
    with pytest.raises(SystemExit) as exit_:
        common.require_data("sst2/train.tsv")
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "nowhere" / "sst2" / "train.tsv") in err
    assert "BERTFLOW_SHARED_DATA" in err


def test_the_data_root_is_beside_the_checkout_unless_set():
    import subprocess

    code = "from lib import common; print(common.DATA_ROOT)"
    bench = common.BENCH_DIR
    env = {k: v for k, v in __import__("os").environ.items() if k != "BERTFLOW_SHARED_DATA"}
    out = subprocess.run([sys.executable, "-c", code], cwd=bench, env=env, text=True,
                         capture_output=True, check=True).stdout.strip()
    assert out == str(common.PROJECT_ROOT.parent / "shared" / "data")
    out = subprocess.run([sys.executable, "-c", code], cwd=bench, text=True, check=True,
                         capture_output=True,
                         env={**env, "BERTFLOW_SHARED_DATA": "/data/x"}).stdout.strip()
    assert out == "/data/x"


@pytest.mark.parametrize("script", ["tokenize_throughput", "train_throughput", "mfu",
                                    "train_step_ablation", "scale", "quality", "determinism",
                                    "evaluation_floor", "evaluation_cost",
                                    "sweep_pruning", "batch_score_throughput",
                                    "score_scale", "profile_byte_bpe", "class_weights",
                                    "tokenizer_parity"])
def test_a_benchmark_without_its_data_exits_non_zero(script, tmp_path):
    import os
    import subprocess

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = subprocess.run([sys.executable, str(common.BENCH_DIR / f"{script}.py")],
                          env={**os.environ, "BERTFLOW_SHARED_DATA": str(tmp_path),
                               "TMPDIR": str(scratch)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "BERTFLOW_SHARED_DATA" in done.stderr and str(tmp_path) in done.stderr
    assert _left_behind(scratch) == [], "it made temporary files before checking its data"


def _left_behind(scratch: Path) -> list[str]:
    """What a finished script left in its temporary folder, less two things the script does
    not own: TensorFlow's AutoGraph sources of processes ended by a signal (its stopped
    servers and workers: TensorFlow removes them at a normal exit only), and the peer's
    torch compile cache (torchinductor_$USER), which torch keeps across runs by design."""
    return sorted(p.name for p in scratch.iterdir()
                  if not p.name.startswith(("__autograph_generated_file", "torchinductor_")))


def test_results_written_atomically_with_machine_info(monkeypatch, tmp_path):
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(common, "PROJECT_ROOT", tmp_path)
    path = common.write_results("demo_bench", {"x": 1})
    data = json.loads(path.read_text())
    assert data["x"] == 1 and data["benchmark"] == "demo_bench"
    assert data["machine"]["cores"] >= 1 and "date_utc" in data
    assert not list(tmp_path.glob("*.tmp"))


def test_alternate_interleaves_and_median():
    calls = []
    runs = common.alternate({"a": lambda: calls.append("a") or 1.0,
                             "b": lambda: calls.append("b") or 3.0}, repeats=3)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert common.median(runs["b"]) == 3.0
    assert common.verdict(2.0, 1.5).startswith("met")
    assert common.verdict(1.0, 2.0).startswith("MISSED by 50%")


def test_length_grouped_batches_cover_rows_once():
    lengths = [i % 37 + 3 for i in range(200)]
    batches = trainbench_data.length_grouped_batches(lengths, batch_size=8, seed=0, mega=5)
    flat = [i for b in batches for i in b]
    assert len(flat) == len(set(flat)) == 200 and all(len(b) == 8 for b in batches)


def test_flop_formula():
    # MiniLM-L6-H384: 6 * (4*384^2 + 2*384*1536) matmul parameters per token.
    p_tok = 6 * (4 * 384 * 384 + 2 * 384 * 1536)
    assert p_tok == 10_616_832
    assert trainbench_data.train_flops(10, 0, 0) == 6 * p_tok * 10


def test_whole_sentence_hold_out_drops_the_held_out_sentences_own_phrases(monkeypatch):
    """SST-2 lists each sentence and its parse's phrases as rows: holding out a sentence must
    also drop the phrases that exist only because of it, and keep those other rows share."""
    import quality

    monkeypatch.setattr(quality, "HELD_OUT_SENTENCES", 1)
    a = "the film " + " ".join(f"a{i}" for i in range(14))
    b = "the film " + " ".join(f"b{i}" for i in range(14))
    rows = [(a, "1"), (b, "0"), ("a3 a4 a5", "1"), ("b3 b4 b5", "0"), ("the film", "1"),
            (" ".join(a.split()[:15]), "1"), ("short one", "0")]  # row 5 is part of a
    train, evals = quality.whole_sentence_split(rows)
    assert len(evals) == 1 and evals[0] in rows[:2]  # rows 0 and 1: the only whole sentences
    held, kept = ("a", "b") if evals[0] == rows[0] else ("b", "a")
    texts = [text for text, _ in train]
    assert "the film" in texts and "short one" in texts  # shared with a kept row, or unrelated
    assert f"{kept}3 {kept}4 {kept}5" in texts and f"{held}3 {held}4 {held}5" not in texts
    assert all(not text.startswith(f"the film {held}0") for text in texts)



# --- every benchmark in smoke mode, its fresh output checked against its schema -------------
ROOT = Path(__file__).resolve().parent.parent
PEER_PY = ROOT / ".venv-peer" / "bin" / "python"
NO_PEER = (f"{PEER_PY} is absent: the peer side needs its own venv with torch (python3 -m venv "
           f".venv-peer && .venv-peer/bin/pip install -r benchmarks/requirements.txt)")
# script -> (arguments of a bertflow-only smoke run, of a peer-only one or None)
SMOKE = {
    # the peer's run on a tiny XLM-R (issue 45's families: bertflow's random checkpoint, the
    # family's tokenizer, pad id 1), in the same one peer run
    "train_throughput": (["--configs", "bertflow"],
                         ["--configs", "peer", "--model", "xlm-roberta-base"]),
    "mfu": (["--config", "bertflow"], ["--config", "peer"]),
    "model_sizes": (["--sides", "bertflow"], ["--sides", "peer"]),
    "quality": (["--sides", "bertflow"], ["--sides", "peer"]),
    "tokenize_throughput": ([], None),  # its baseline is HF's tokenizer, in this venv
    "import_time": ([], None),
    "step_start": ([], None),
    "train_step_ablation": ([], None),  # bertflow's variants only
    "scale": ([], None),
    "determinism": ([], None),  # bertflow's deterministic and not, no peer
    "preemption_save": ([], None),  # bertflow's saves only, to disk and the emulators
    # bertflow's train step only, short and long runs; forked from the session's warm-start
    # server (its steps in cold interpreters, then a server of its own, were most of its time;
    # the cold start is step_start's smoke, a server's start quality's sst2 smoke)
    "train_fixed_cost": (["--start", "warm"], None),
    "matmul_ceiling": ([], None),  # the step's matmuls alone, no training side
    "evaluation_floor": (["--sides", "bertflow"], ["--sides", "peer"]),
    "early_stopping": ([], None),  # bertflow's two arms, no peer
    "evaluation_cost": ([], None),  # bertflow's train step only
    # one bertflow run per seed, three thresholds; its smoke forks its steps from a warm-start
    # server (the cold steps: evaluation_cost's smoke)
    "tuned_thresholds": ([], None),
    # the model version's steps fork from a warm-start server (common.smoke_warm_server: this
    # session's), the scoring workers start cold
    "batch_score_throughput": (["--sides", "bertflow"], ["--sides", "peer"]),
    # 120 and 240 rows through validate, score and publish processes, Parquet, one worker
    "score_scale": ([], None),  # both scorers score smoke_version's version
    "long_texts": ([], None),  # bertflow's two arms, no peer; steps forked, as above
    "class_weights": (["--arms", "bertflow_none,bertflow_balanced"],
                      ["--arms", "peer_balanced,peer_none"]),
    # the tests' tiny vocabularies of the three families; its peer is transformers, here
    "tokenizer_parity": ([], None),
    # a two-Param DAG of its own, parsed and serialized with and without "$schema" (its cost
    # is Airflow's import, once: tests/test_config.py checks the real forms' draft)
    "dag_parse": ([], None),
}


def _problems(path: Path) -> list[str]:
    """tests/test_benchmark_results.py's check: the schema of the script that wrote it, no
    absolute path of the machine."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_results_check", ROOT / "tests" / "test_benchmark_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.problems(path)


def smoke(script: str, tmp_path: Path, *args: str, own_server: bool = False) -> dict:
    """benchmarks/SCRIPT.py --smoke, its results in tmp_path ($BERTFLOW_BENCH_RESULTS_DIR):
    the results file, checked against the script's schema. A smoke reuses the session's
    warm-start server (conftest.py) where it can; `own_server` hides it, so the script starts
    and times its own."""
    import os
    import subprocess

    from tasks.provision.local import warm_start

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "BERTFLOW_BENCH_RESULTS_DIR": str(tmp_path), "TMPDIR": str(scratch)}
    if own_server:
        env.pop(warm_start.SOCKET_ENV, None)
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), "--smoke",
                           *args], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    # A full-size run's work folders hold GBs (checkpoints, SavedModels): it removes them.
    assert _left_behind(scratch) == [], f"{script} left temporary files behind"
    path = tmp_path / f"{script}.json"
    assert path.is_file(), f"{script} --smoke wrote no {path.name}: {done.stdout[-1000:]}"
    assert not _problems(path), _problems(path)
    data = json.loads(path.read_text())
    assert data["smoke"] is True
    assert not list((ROOT / "benchmarks" / "results").glob("*.json.tmp"))
    return data


def _session_server() -> bool:
    """Whether this session runs a warm-start server (conftest.py; not BERTFLOW_TEST_COLD)."""
    import os

    from tasks.provision.local import warm_start

    return bool(os.environ.get(warm_start.SOCKET_ENV))


# Scripts that score a model version: their smokes take smoke_version's (--version).
SCORERS = {"batch_score_throughput", "score_scale"}


@pytest.fixture(scope="module")
def smoke_version(tmp_path_factory) -> str:
    """The scorers' smoke version, made once for their three runs as each run made its own:
    batch_score_throughput.make_version on 48 synthetic rows from the tiny random BERT, one
    step, the steps forked from a warm-start server (~40 s of each run, most of it export)."""
    import os

    from batch_score_throughput import make_version
    from tasks.provision.local import warm_start

    work = tmp_path_factory.mktemp("smoke-version")
    train = common.smoke_data_root(work / "data", rows=48) / "sst2" / "train.tsv"
    model_dir = common.smoke_model_dir(work / "tiny-random-bert")
    serving = os.environ.get(warm_start.SOCKET_ENV)  # run_step sets it to the server's
    try:
        with common.smoke_warm_server(True, work / "warm_start.log") as socket:
            return make_version(work, "smoke", train, str(model_dir), True, socket)
    finally:
        os.environ.pop(warm_start.SOCKET_ENV, None)
        if serving:
            os.environ[warm_start.SOCKET_ENV] = serving


def smoke_args(script: str, side: int, request) -> list[str]:
    """SMOKE's arguments of the side (0 bertflow, 1 peer), a scorer's with smoke_version."""
    args = list(SMOKE[script][side])
    if script in SCORERS:
        args += ["--version", request.getfixturevalue("smoke_version")]
    return args


@pytest.mark.parametrize("script", [s for s in SMOKE if s != "model_sizes"])
def test_smoke_bertflow_side_matches_its_schema(script, tmp_path, request):
    # quality's sst2 smoke starts the warm-start server it times; the other smokes that want
    # one (quality's new tasks among them) fork from the session's (common.warm_server)
    data = smoke(script, tmp_path, *smoke_args(script, 0, request),
                 own_server=script == "quality")
    if script == "train_throughput":
        side = data["summary"]["bertflow"]
        assert side["median_startup_s"] > 0 and side["recipe"]["untimed_warmup_steps"] == 3
        (run,) = data["runs"]["bertflow"]
        assert run["warmup_steps"] == run["steps"] == 3 and len(run["step_seconds"]) == 3
        # the shape the side saved, counted from its file: the tiny BERT's 2 x 32
        model = side["model"]
        assert (model["family"], model["layers"], model["hidden"]) == ("bert", 2, 32)
        assert model["parameters"] > 30522 * 32 and model["weights"].startswith("RANDOM")
    if script == "mfu":
        assert data["recipe"]["timed_steps"] == 3 and 0 < data["mfu"]
    if script == "quality":
        assert data["recipes"]["peer"]["optimizer"].startswith("adamw_torch_fused")
    if script == "tokenize_throughput":
        assert data["rows"] == 64 and data["median_rows_per_s"]["bertflow_step"] > 0
    if script == "preemption_save":
        after, before = data["runs"]["after"][0], data["runs"]["before"][0]
        # before sends every kept checkpoint, after only the new one
        assert before["folder_bytes"] > before["checkpoint_bytes"]
        assert set(after["upload_s"]) == {"local", "gs", "s3"} and data["order"][:2] == [
            "before", "after"]
    if script == "train_fixed_cost":
        assert data["start"] == "warm"
        assert (data["warm_server_ready_s"] is None) == _session_server()  # reused if any
        for name, steps in data["steps"].items():
            (run,) = data["runs"][name]
            assert run["steps"] == steps and 0 < run["startup_s"] < run["wall_s"]
            assert run["fixed_s"] < run["wall_s"] and run["checkpoint_s"] > 0
    if script == "matmul_ceiling":
        assert data["rows"] == 12 and 0 < data["ceiling_examples_per_s"]
    if script == "evaluation_floor":
        (run,) = data["datasets"]["sst2"]["runs"]["bertflow"]
        assert 0 < run["num_examples"] < 64 and run["trace_s"] > 0 and run["steady_run_s"] > 0
        # the worker's own evaluation and the train step's are both timed, each non-zero
        assert run["evaluate_model_s"] > run["steady_run_s"] and run["evaluation_in_train_s"] > 0
        # the second worker, graph optimizer off, ran the same loop
        assert run["unoptimized_first_run_s"] > 0 and run["unoptimized_steady_run_s"] > 0
        computed = data["datasets"]["sst2"]["computed"]
        assert computed == {"graph_floor_s": run["trace_s"] + run["steady_run_s"]}
    if script == "quality":
        assert data["bertflow_start"] == "warm" and data["warm_server_ready_s"] > 0
        # the train step evaluated in memory (evaluate_in_train), and that time is recorded
        (run,) = data["results"]["sst2"]["bertflow"].values()
        assert 0 < run["evaluation_in_train_seconds"] < run["step_seconds"]["train"]
        # what the sides do differently is in the file (issue 47): init-run and the warm
        # server's start are outside bertflow's wall; the peer predicts in file order
        assert 0 < run["init_run_seconds"] and run["wall_seconds"] == sum(
            run["step_seconds"].values())
        asym = data["asymmetries"]
        assert set(asym["outside_bertflow_wall"]) == {"init_run", "warm_server_start"}
        assert asym["evaluation_order"]["peer"].startswith("file order")
        assert "sorted by length" in asym["evaluation_order"]["bertflow"]
    if script == "early_stopping":
        for dataset in data["datasets"].values():
            (full,), (early,) = dataset["runs"]["full"], dataset["runs"]["early"]
            assert full["steps"] == full["total_steps"] and full["validation_evaluations"] == 1
            assert early["validation_evaluations"] >= 1 and early["steps"] <= full["steps"]
    if script == "evaluation_cost":
        (model,) = data["models"].values()
        (run,) = model["runs"]
        # max_steps 6, eval_every_steps 2: evaluations at steps 2, 4 and 6
        assert run["steps"] == 6 and len(run["evaluation_s"]) == 2
    if script == "tuned_thresholds":
        (run,) = data["runs"]
        # ~10 validation rows: every label has too few positives and keeps 0.5, so the
        # tuned arm's figures are the global 0.5 arm's, counted by another process
        assert sorted(run["fallback_labels"]) == sorted(run["thresholds"])
        assert run["arms"]["tuned"] == run["arms"]["global_0.5"]
    elif script == "long_texts":
        (cut,), (windowed,) = data["runs"]["truncate"], data["runs"]["window"]
        assert cut["train_texts"] == windowed["train_texts"] == data["sets"]["0"]["train_texts"]
        # 30-80 words in 16 pieces: every text is cut, and windowed into several
        assert windowed["train_records"] > 2 * cut["train_records"] == 2 * cut["train_texts"]
        assert cut["test_texts_cut"] == windowed["test_texts_cut"] == cut["test_texts"]
    if script == "score_scale":
        assert [(r["rows"], r["format"]) for r in data["runs"]] == [(120, "parquet"),
                                                                    (240, "parquet")]
        for run in data["runs"]:  # every row scored; each task process measured
            assert run["scored_rows"] + run["error_rows"] == run["rows"]
            assert run["score"]["worker_rss_bytes"] > run["score"]["rss_bytes"] > 0
        assert set(data["verdict"]["rss_growth_largest_over_smallest"]) == {"parquet"}
    if script == "class_weights":
        _check_class_weights(data, "bertflow")
    if script == "tokenizer_parity":
        _check_tokenizer_parity(data)
    if script == "determinism":
        assert data["summary"]["deterministic_weights_bitwise_equal"] is True
        assert [data["runs"][r]["manifest_deterministic"] for r in data["order"]] == [
            True, False, True, False]
        assert all(run["steps"] == 6 for run in data["runs"].values())
    if script == "dag_parse":
        (row,) = data["files"].values()
        # one Param names draft 7, one none; to_dict resolves every Param twice per task
        # (Airflow 3.3 compares each task's ParamsDict with a default, then casts it to str)
        assert row["dags"] == {"dag_parse_smoke": {"params": 2, "tasks": 2, "resolves": 8,
                                                   "params_with_schema_key": 1}}
        assert all(len(row["runs"][side]) == 1 for side in ("as_shipped", "no_draft"))
        assert row["computed"]["cpu_ms_per_resolve_no_draft"] > 0


# model_sizes' peer side runs beside its bertflow side, in one invocation (test_model_sizes_...)
@pytest.mark.parametrize("script", [s for s in SMOKE
                                    if SMOKE[s][1] is not None and s != "model_sizes"])
def test_smoke_peer_side_matches_its_schema(script, tmp_path, request):
    if not PEER_PY.exists():
        pytest.skip(NO_PEER)
    data = smoke(script, tmp_path, *smoke_args(script, 1, request))
    native_bf16 = not set(common.cpu_flags()).isdisjoint({"avx512_bf16", "amx_bf16"})
    if script == "train_throughput":
        (run,) = data["runs"]["peer"]
        assert run["fused_adamw"] is True and run["bf16"] is native_bf16
        assert run["warmup_steps"] == run["steps"] and run["recipe"]["max_grad_norm"] == 1.0
        assert run["recipe"]["weight_decay"] == 0.0 and data["summary"]["peer"]["median_startup_s"]
        # the family's class loaded bertflow's random checkpoint, tokens below its vocabulary
        model = data["summary"]["peer"]["model"]
        assert (model["family"], model["class"]) == ("xlm-roberta",
                                                     "XLMRobertaForSequenceClassification")
        assert (model["layers"], model["hidden"]) == (2, 32) and model["parameters"] > 0
        assert model["pad_token_id"] == 1  # rows padded with XLM-R's <pad>, not <s> (0)
        assert model["name"] == "xlm-roberta-base" and model["weights"].startswith("RANDOM")
        assert data["model"].startswith("xlm-roberta-base's tiny")
    if script == "evaluation_floor":
        (run,) = data["datasets"]["sst2"]["runs"]["peer"]
        assert 0 < run["num_examples"] < 64 and run["evaluate_s"] > 0
        assert "computed" not in data["datasets"]["sst2"]  # nothing to compare without bertflow
    if script == "quality":
        (run,) = data["results"]["sst2"]["peer"].values()
        assert run["optim"] == "adamw_torch_fused" and run["bf16"] is native_bf16
    if script == "class_weights":
        _check_class_weights(data, "peer")


def _check_class_weights(data: dict, side: str) -> None:
    """Both arms of a side ran on the imbalanced rows, the balanced one with bertflow's
    balanced weights (as the side records them), the other with none."""
    balanced, none = data["runs"][f"{side}_balanced"]["0"], data["runs"][f"{side}_none"]["0"]
    # 4 classes of 20 rows; two keep round(10%) = 2 rows: weights 44 / (4 x count)
    assert data["data"]["rows_per_class"] == {label: 2 if label in data["data"][
        "minority_classes"] else 20 for label in data["data"]["balanced_weights"]}
    assert data["data"]["balanced_weights"] == {label: 44 / (4 * n) for label, n in data[
        "data"]["rows_per_class"].items()}
    assert balanced["class_weights"] == pytest.approx(data["data"]["balanced_weights"])
    assert none["class_weights"] is None and balanced["num_train_examples"] == 44
    # the weights are in the loss: same rows, seed and steps, another loss
    assert balanced["final_loss"] != none["final_loss"]
    assert set(balanced["per_class"]) == set(data["data"]["rows_per_class"])
    assert set(data["computed_deltas"]) == {f"{side}_balanced_vs_none"}


def _check_tokenizer_parity(data: dict) -> None:
    """Each family's tiny vocabulary (the one its tests train) gives transformers' ids on the
    synthetic rows of every set, and on the generated multilingual texts but for one known
    difference, where the sentencepiece library gives bertflow's ids; it cuts a text of more
    than 512 pieces where transformers cuts it, alone and as a pair."""
    import re

    # 64 rows of each synthetic set (banking77: a copy of snips) and 200 generated texts
    assert data["texts_by_set"] == {"sst2": 64, "snips": 64, "banking77": 64,
                                    "goemotions": 64, "wnut17": 64, "multilingual": 200}
    assert set(data["families"]) == {"roberta", "xlm-roberta", "deberta-v2"}
    assert data["families"]["roberta"]["mismatches"] == 0
    for name, family in data["families"].items():
        assert {s for s, n in family["mismatches_by_set"].items() if n} <= {"multilingual"}
        # transformers' Precompiled normalizer maps a grapheme cluster whole or char by char:
        # a combining mark before a zero-width (non-)joiner stays uncomposed (n U+0303 U+200C
        # gives n and U+0303), where SentencePiece, and bertflow, compose it (docs/model.md)
        for shown in family["first_mismatches"]:
            assert re.search("[\u0300-\u036f][\u200b-\u200d\u2060\ufeff]",
                             shown["text"]), (name, shown)
        assert family["cut_512"] == {**family["cut_512"], "single_equal": True,
                                     "single_length": 512, "pair_equal": True,
                                     "pair_length": 512}
        assert all(re.fullmatch(r"trained by (test_\w+|family_checkpoints)\.train_\w+",
                                f["smoke"]) for f in family["files"].values()), family["files"]
        assert min(family["median_rows_per_s"].values()) > 0
        if name != "roberta":  # the sentencepiece library on the same model file agrees
            spm = family["sentencepiece"]
            assert spm["vs_bertflow"]["mismatches"] == 0, spm["vs_bertflow"]
            assert spm["vs_hf"]["mismatches"] == family["mismatches"]
            assert spm["rows_per_s"]["median"] > 0


def test_smoke_quality_on_the_new_tasks(tmp_path):
    """quality.py --smoke on GoEmotions-like multi-label rows and WNUT17-like CoNLL sentences
    (common.smoke_task_data): each side records its task's metrics, the same warm-up on both
    sides, and the file matches the schema. bertflow's token classification side runs once
    the task is wired (until then init-run refuses it and the run records the error)."""
    from tasks.task_kinds import KINDS

    sides = "bertflow,peer" if PEER_PY.exists() else "bertflow"
    data = smoke("quality", tmp_path, "--datasets", "goemotions,wnut17", "--sides", sides,
                 "--peer-env", "OMP_WAIT_POLICY=PASSIVE")
    assert data["epochs"] == {"goemotions": 1, "wnut17": 3}
    assert (data["warm_server_ready_s"] is None) == _session_server()  # reused if any
    shared = {"learning_rate": 2e-4, "warmup_ratio": 0.06}
    assert data["shared_by_dataset"] == {"goemotions": shared, "wnut17": shared}
    for side in ("bertflow", "peer"):
        assert data["recipes"][side]["warmup_ratio"] == 0.06
        assert data["recipes"][side]["learning_rate"] == 2e-4
    assert data["summary"]["goemotions"]["task"] == "multi_label"
    assert data["summary"]["wnut17"]["task"] == "token_classification"
    run = data["results"]["goemotions"]["bertflow"]["0"]
    assert run["task"] == "multi_label" and 0 <= run["micro_f1"] <= 1
    assert run["config"]["warmup_ratio"] == 0.06 and run["config"]["label_column"] == "labels"
    assert run["config"]["learning_rate"] == 2e-4
    assert run["num_train_examples"] == 64 and run["num_eval_examples"] == 16
    run = data["results"]["wnut17"]["bertflow"]["0"]
    if KINDS["token_classification"].wired:
        assert run["task"] == "token_classification" and 0 <= run["f1"] <= 1
        assert run["num_eval_examples"] == 16
    else:
        assert "not wired yet" in run["error"]
    if not PEER_PY.exists():
        pytest.skip(NO_PEER)
    assert data["peer_env"] == ["OMP_WAIT_POLICY=PASSIVE"]
    peer = data["results"]["goemotions"]["peer"]["0"]
    assert peer["task"] == "multi_label" and 0 <= peer["micro_f1"] <= 1
    assert peer["warmup_ratio"] == 0.06 and peer["num_eval_examples"] == 16
    peer = data["results"]["wnut17"]["peer"]["0"]
    assert peer["task"] == "token_classification" and 0 <= peer["f1"] <= 1
    assert (peer["num_train_examples"], peer["num_eval_examples"]) == (64, 16)


def test_a_smoke_run_refuses_to_write_to_the_results_folder(tmp_path):
    import os
    import subprocess

    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train_throughput.py"),
                           "--smoke"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "BERTFLOW_BENCH_RESULTS_DIR":
                               str(ROOT / "benchmarks" / "results")})
    assert done.returncode != 0 and "must not write to benchmarks/results/" in done.stderr


def test_every_benchmark_has_a_smoke_mode():
    writers = {p.stem for p in (ROOT / "benchmarks").glob("*.py")
               if "write_results(" in p.read_text()}
    with_smoke = {p.stem for p in (ROOT / "benchmarks").glob("*.py")
                  if '"--smoke"' in p.read_text()}
    assert set(SMOKE) | SMOKE_NOT_IN_SUITE <= with_smoke
    assert writers - with_smoke == NO_SMOKE_YET, (
        "a benchmark without --smoke (or NO_SMOKE_YET out of date)")


# Benchmarks without a smoke mode yet (model_swap.py is the model engineer's).
# e2e_demo times `make demo` itself (~35 s wall at best): it has no smaller form.
NO_SMOKE_YET = {"model_swap", "e2e_demo"}
# Smoke modes too slow for `make test`: sweep_pruning's is two whole bert_sweep dag.test runs
# (~3 min on 2 cores); tests/test_dag_sweep.py runs a pruned sweep through the same DAG.
SMOKE_NOT_IN_SUITE = {"sweep_pruning"}


def _model_sizes(tmp_path, *args: str) -> str:
    """benchmarks/model_sizes.py writing its results file under tmp_path; its stdout. It
    leaves nothing in its temporary folder, as smoke() checks."""
    import os
    import subprocess

    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "model_sizes.py"),
                           "--results-dir", str(tmp_path), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "TMPDIR": str(scratch)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert _left_behind(scratch) == [], "model_sizes left temporary files behind"
    return done.stdout


def test_model_sizes_writes_measured_and_computed_figures(tmp_path):
    """--smoke: its tiny preset, a 2-layer, hidden-32 random BERT, one timed step; both sides
    in one invocation (each run is a fresh process either way), the peer's where it can."""
    sides = "bertflow,peer" if PEER_PY.exists() else "bertflow"
    out = _model_sizes(tmp_path, "--smoke", "--sides", sides)
    assert not _problems(tmp_path / "model_sizes.json"), _problems(tmp_path / "model_sizes.json")
    results = json.loads((tmp_path / "model_sizes.json").read_text())
    assert results["smoke"] is True and "RANDOM" in results["weights"]
    assert results["machine"]["cpu_model"] is not None
    (point,) = results["points"]
    side = point["sides"]["bertflow"]
    assert side["median_examples_per_s"] > 0 and side["median_tokens_per_s"] > 0
    assert 0 < side["median_mfu"] < 1 and side["peak_rss_bytes"] > 100 << 20
    assert side["runs"][0]["result"]["startup_s"] > 0
    assert [m["batch"] for m in point["measured_peak_rss"]] == [2, 4]
    for row in point["estimate_vs_measured"]:
        assert row["estimate_bytes"] == row["estimate"]["total"] > 0
        assert row["error"] == row["estimate_bytes"] / row["measured_bytes"] - 1
    largest = point["largest_batch_24gib"]
    assert largest["computed"] is True
    assert largest["no_accumulation"] >= largest["with_accumulation"] > 0
    assert results["estimate_error"]["points"] == 2 and "peak RSS" in out

    # --rescore recomputes the estimate's figures from the measurements and runs nothing
    assert "rescored" in _model_sizes(tmp_path, "--rescore")
    again = json.loads((tmp_path / "model_sizes.json").read_text())
    assert again["points"][0]["measured_peak_rss"] == point["measured_peak_rss"]
    assert again["rescored"]["command"].endswith("--rescore --name model_sizes")
    assert not _problems(tmp_path / "model_sizes.json")
    if not PEER_PY.exists():
        pytest.skip(NO_PEER)
    side = point["sides"]["peer"]
    assert side["median_examples_per_s"] > 0 and side["peak_rss_bytes"] > 100 << 20
    assert side["runs"][0]["result"]["fused_adamw"] is True
    assert "fused AdamW" in results["precision"]["peer"]


def test_the_imbalanced_set_keeps_a_tenth_of_half_the_classes_seeded():
    import class_weights

    rows = [(f"text {i}", f"label{i % 6}") for i in range(600)]  # 6 classes of 100 rows
    kept, minority = class_weights.imbalanced(rows, data_seed=3)
    assert len(minority) == 3 and kept == class_weights.imbalanced(rows, 3)[0]
    counts = {label: sum(1 for _, lab in kept if lab == label) for label in {r[1] for r in rows}}
    assert counts == {label: 10 if label in minority else 100 for label in counts}
    assert kept == [row for row in rows if row in set(kept)]  # file order, rows untouched
    assert class_weights.imbalanced(rows, 4) != (kept, minority)
