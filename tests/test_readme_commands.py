"""Every `.venv/bin/python -m tasks ...` command the README and docs/ show runs as written (in a
temporary artifact root instead of .artifacts/ and /tmp/try), block by block, in order. The
README's own-data example runs exactly as written, in a folder holding the `my_data.tsv` it
names (a small TSV with labels of its own, none of the demo's)."""
from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PREFIX = ".venv/bin/python -m tasks "
OWN_DATA = "my_data.tsv"  # the file the README's own-data example names


def command_blocks(path: Path) -> list[list[str]]:
    """The fenced blocks of a Markdown file that hold `python -m tasks` commands, each as its
    list of commands (continuation lines joined)."""
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", path.read_text(), flags=re.S | re.M)
    out = []
    for block in blocks:
        commands = block.replace("\\\n", " ").splitlines()
        commands = [re.sub(r"\s+", " ", c).strip() for c in commands]
        commands = [c for c in commands if c.startswith(PREFIX)]
        if commands:
            out.append(commands)
    return out


def readme_command_blocks() -> list[list[str]]:
    """The README's blocks, then docs/'s (deployment.md holds the provision dry run)."""
    docs = sorted((PROJECT_ROOT / "docs").glob("*.md"))
    return [b for path in [PROJECT_ROOT / "README.md", *docs] for b in command_blocks(path)]


BLOCKS = readme_command_blocks()
OWN_DATA_BLOCKS = [b for b in command_blocks(PROJECT_ROOT / "README.md")
                   if any(OWN_DATA in c for c in b)]


def test_the_docs_show_the_cli_and_the_dry_run():
    steps = [c.split()[3] for block in BLOCKS for c in block]
    assert {"init-run", "data", "tokenize", "train", "evaluate", "provision"} <= set(steps), steps
    assert len(OWN_DATA_BLOCKS) == 1, "the README shows one own-data example"


def _run(command: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    command = command.split("#", 1)[0].strip()  # an inline comment
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True,
                          timeout=900, env=env)


@pytest.mark.parametrize("commands", [b for b in BLOCKS if b not in OWN_DATA_BLOCKS],
                         ids=lambda b: b[0].split()[3] + "-block")
def test_readme_commands_run_as_written(commands, tmp_path):
    for command in commands:
        command = (command.replace(".artifacts/", f"{tmp_path}/artifacts/")
                   .replace("/tmp/try", f"{tmp_path}/try")
                   .replace("> gke.yaml", f"> {tmp_path}/gke.yaml")
                   .replace(".venv/bin/python", sys.executable))
        done = _run(command, PROJECT_ROOT)
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"


# Labels of its own (the demo's are billing, shipping, technical): with the demo's eval file
# kept as the default, the data step failed on labels the training data never had.
OWN_ROWS = ([(f"the parcel number {i} arrived broken and wet", "damaged") for i in range(14)]
            + [(f"please send invoice {i} again as a pdf file", "paperwork") for i in range(14)]
            + [(f"my order {i} is late by three whole weeks", "late") for i in range(14)])


def test_the_own_data_example_runs_as_written_and_splits_the_train_file(tmp_path):
    """The README's own-data block, character for character, from a folder that holds
    `my_data.tsv` and a `.venv` link to this checkout's: only a train file, so the run holds
    out a stratified eval_fraction of it and learns the file's own labels."""
    (tmp_path / ".venv").symlink_to(PROJECT_ROOT / ".venv")
    with open(tmp_path / OWN_DATA, "w", newline="") as f:
        csv.writer(f, delimiter="\t", lineterminator="\n").writerows(
            [("text", "label"), *OWN_ROWS])
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}  # `-m tasks` from the checkout
    env.pop("BERTFLOW_ARTIFACT_ROOT", None)
    (commands,) = OWN_DATA_BLOCKS
    for command in commands:
        done = _run(command, tmp_path, env)
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    run_dir = tmp_path / re.search(r"--run-dir (\S+)", commands[0]).group(1)
    data = json.loads((run_dir / "data" / "manifest.json").read_text())
    assert data["eval_source"] == "split" and data["sources"]["eval"] is None
    assert data["labels"] == ["damaged", "late", "paperwork"]
    assert data["splits"]["eval"]["label_counts"] == {"damaged": 1, "late": 1, "paperwork": 1}
    assert data["splits"]["train"]["num_examples"] == len(OWN_ROWS) - 3
    metrics = json.loads((run_dir / "evaluate" / "metrics.json").read_text())
    assert metrics["labels"] == data["labels"] and metrics["num_examples"] == 3
