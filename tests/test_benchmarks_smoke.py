"""Smoke test of the benchmark harness (no timings asserted, no TensorFlow, no data needed)."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import common  # noqa: E402
import trainbench_data  # noqa: E402


def test_missing_data_skips_cleanly(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(common, "DATA_ROOT", tmp_path / "nowhere")
    with pytest.raises(SystemExit) as exit_:
        common.require_data("sst2/train.tsv")
    assert exit_.value.code == 0
    assert "SKIP" in capsys.readouterr().out


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
