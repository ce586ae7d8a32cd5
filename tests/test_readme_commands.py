"""Every `.venv/bin/python -m tasks ...` command the README shows runs as written (in a
temporary artifact root instead of .artifacts/ and /tmp/try), block by block, in order."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PREFIX = ".venv/bin/python -m tasks "


def readme_command_blocks() -> list[list[str]]:
    """The README's fenced blocks that hold `python -m tasks` commands, each as its list of
    commands (continuation lines joined)."""
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", (PROJECT_ROOT / "README.md").read_text(),
                        flags=re.S | re.M)
    out = []
    for block in blocks:
        commands = block.replace("\\\n", " ").splitlines()
        commands = [re.sub(r"\s+", " ", c).strip() for c in commands]
        commands = [c for c in commands if c.startswith(PREFIX)]
        if commands:
            out.append(commands)
    return out


BLOCKS = readme_command_blocks()


def test_the_readme_shows_the_cli_and_the_dry_run():
    steps = [c.split()[3] for block in BLOCKS for c in block]
    assert {"init-run", "data", "tokenize", "train", "provision"} <= set(steps), steps


@pytest.mark.parametrize("commands", BLOCKS, ids=lambda b: b[0].split()[3] + "-block")
def test_readme_commands_run_as_written(commands, tmp_path):
    for command in commands:
        command = command.split("#", 1)[0].strip()  # an inline comment
        command = (command.replace(".artifacts/", f"{tmp_path}/artifacts/")
                   .replace("/tmp/try", f"{tmp_path}/try")
                   .replace("> gke.yaml", f"> {tmp_path}/gke.yaml")
                   .replace(".venv/bin/python", sys.executable))
        done = subprocess.run(["bash", "-c", command], cwd=PROJECT_ROOT, capture_output=True,
                              text=True, timeout=900)
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
