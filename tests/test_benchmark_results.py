"""Nothing under benchmarks/results/ is edited by hand: each results file names the command that
wrote it, and validates against the JSON Schema of that script (benchmarks/schemas/), which
allows no field the script does not write. Files the current scripts cannot reproduce are in
benchmarks/results/archive/, outside this check. No results file holds an absolute path of the
machine (data root, venv, temporary folders): common.write_results writes them relative to the
checkout, as `<data>/...` or `<tmp>/...`; files written before that rule are archived, not
edited (benchmarks/results/archive/README.md)."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import jsonschema
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from lib import common  # noqa: E402

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
RESULTS = BENCH / "results"
SCHEMAS = BENCH / "schemas"
COMMAND = re.compile(r"^\./\.venv/bin/python benchmarks/(\w+)\.py( |$)")


def validator_for(script: str) -> jsonschema.protocols.Validator:
    schema = json.loads((SCHEMAS / f"{script}.schema.json").read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def problems(path: Path) -> list[str]:
    """Why a results file is not what its script writes (empty: it is)."""
    data = json.loads(path.read_text())
    match = COMMAND.match(data.get("command") or "")
    if not match:
        return [f"no `command` naming a benchmark script: {data.get('command')!r}"]
    script = match.group(1)
    if not (BENCH / f"{script}.py").exists():
        return [f"its command names benchmarks/{script}.py, which does not exist"]
    if not (SCHEMAS / f"{script}.schema.json").exists():
        return [f"benchmarks/schemas/{script}.schema.json is missing"]
    out = [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
           for e in validator_for(script).iter_errors(data)]
    out += [f"absolute path of the machine: {p!r}" for p in common.absolute_paths(data)]
    if data.get("benchmark") != path.stem:
        out.append(f"benchmark {data.get('benchmark')!r} is not the file's name {path.stem!r}")
    return out


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_results_file_is_what_its_script_writes(path):
    assert not problems(path), f"{path.name}: {problems(path)}"


def test_every_benchmark_that_writes_results_has_a_schema():
    writers = {p.stem for p in BENCH.glob("*.py") if "write_results(" in p.read_text()}
    assert writers == {p.name.split(".")[0] for p in SCHEMAS.glob("*.schema.json")}


# The only fields a schema leaves optional: written by an older version of the script and
# renamed since (target_1_5x, now target_2x: one of the two is required), or written only when
# a flag asks for them (model_sizes' --rescore), or added as a record of what the live files'
# runs did without saying it (quality's asymmetries, issue 47; early_stopping's validation,
# absent meaning carved from train: those runs are still valid).
# Every other field the script writes now is required, so a live file from before a field
# was added fails and goes to results/archive/.
OPTIONAL = {"train_throughput": {"target_1_5x", "target_2x"}, "model_sizes": {"rescored"},
            "quality": {"asymmetries"}, "early_stopping": {"validation"}}


@pytest.mark.parametrize("schema", sorted(SCHEMAS.glob("*.schema.json")), ids=lambda p: p.name)
def test_a_schema_requires_every_field_its_script_writes_now(schema):
    data = json.loads(schema.read_text())
    if "properties" not in data:  # a schema of another shape (scale: a list per run)
        return
    optional = set(data["properties"]) - set(data.get("required", ()))
    assert optional <= OPTIONAL.get(schema.name.split(".")[0], set()), sorted(optional)


def test_only_results_files_and_their_plots_outside_the_archive():
    assert {p.suffix for p in RESULTS.iterdir() if p.is_file()} <= {".json", ".svg"}


def test_a_hand_edited_or_hand_assembled_file_fails(tmp_path):
    """A field the script never writes (quality.json's `notes`, a per-run `code`), a side it
    does not have, a command naming a script that does not exist: each fails the check."""
    good = json.loads((RESULTS / "train_throughput.json").read_text())
    assert not problems(RESULTS / "train_throughput.json")

    def check(data, name="train_throughput") -> list[str]:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(data))
        return problems(path)

    assert any("notes" in p for p in check({**good, "notes": {"x": "by hand"}}))
    run = good["runs"]["bertflow"][0]
    edited = json.loads(json.dumps(good))
    edited["runs"]["bertflow"][0] = {**run, "code": "abc123"}
    assert check(edited)
    unfinished = json.loads(json.dumps(good))
    unfinished["summary"]["peer_bf16_unfinished"] = good["summary"]["peer"]
    assert any("peer_bf16_unfinished" in p for p in check(unfinished))
    assert check({**good, "command": "./.venv/bin/python benchmarks/train_sweep1.py"})
    assert check({k: v for k, v in good.items() if k != "command"})
    assert any("file's name" in p for p in check(good, name="train_throughput_renamed"))
    archived = RESULTS / "archive" / "quality.json"  # hand-assembled (archive/README.md)
    assert problems(archived), "the hand-assembled quality.json passes"


def test_an_absolute_path_fails_and_write_results_writes_none(tmp_path, monkeypatch):
    good = json.loads((RESULTS / "train_throughput.json").read_text())
    bad = {**good, "runs": {**good["runs"], "bertflow": [
        {**good["runs"]["bertflow"][0], "overrides": {"train_uri": "/work/shared/data/x.tsv"}}]}}
    (tmp_path / "train_throughput.json").write_text(json.dumps(bad))
    assert any("absolute path" in p for p in problems(tmp_path / "train_throughput.json"))

    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    data_file = common.DATA_ROOT / "sst2" / "train.tsv"
    path = common.write_results("demo_paths", {
        "data": str(data_file), "venv": str(common.PROJECT_ROOT / ".venv" / "bin" / "python"),
        "tmp": "--work /tmp/bench-x/art", "uri": "s3://bucket/a/b", "unit": "ex/s",
        "elsewhere": "/opt/models/bert"})
    written = json.loads(path.read_text())
    assert not common.absolute_paths(written)
    assert written["data"] == "<data>/sst2/train.tsv"
    assert written["venv"] == ".venv/bin/python" and written["tmp"] == "--work <tmp>/bench-x/art"
    assert written["uri"] == "s3://bucket/a/b" and written["unit"] == "ex/s"
    assert written["elsewhere"] == "<abs>/bert"
