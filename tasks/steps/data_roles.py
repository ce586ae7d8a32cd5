"""The data step's three roles, shared by tasks/steps/data.py and tasks/steps/token_data.py:
train, validation and test (the `eval` split). A role without a file is carved from the
training data (tasks/steps/split_rule.Router); docs/experiments.md, Three roles for data.
"""
from __future__ import annotations

from typing import Optional

from tasks.config import RunConfig
from tasks.errors import DataError
from tasks.steps.split_rule import Router


def role_files(cfg: RunConfig) -> dict[str, str]:
    """The splits given as files: {"eval": the test data, "validation": ...}."""
    files = {"eval": cfg.test_data_uri, "validation": cfg.validation_uri}
    return {split: uri for split, uri in files.items() if uri}


def split_names(cfg: RunConfig) -> tuple[str, ...]:
    """The data step's splits: train, eval (the test role), and validation when the run has
    validation rows (a file, or a share of the training rows)."""
    has_validation = bool(cfg.validation_uri) or cfg.validation_share > 0
    return ("train", "eval") + (("validation",) if has_validation else ())


def check_quotas(cfg: RunConfig, router: Router, unit: str) -> None:
    """Each carved split gets at least one row (`unit`: rows or sentences), else a DataError
    saying which file to give instead."""
    if router.test is not None and not router.quota("eval"):
        raise DataError(cfg.train_uri, f"too few {unit} to hold out test {unit}",
                        hint="add rows, or give a test_uri")
    if router.validation is not None and not router.quota("validation"):
        raise DataError(cfg.train_uri, f"too few {unit} to hold out validation {unit} "
                                       f"after the test split",
                        hint="add rows, or give a validation_uri")


def role_sources(cfg: RunConfig, has_validation: bool) -> dict:
    """The manifest's record of where each held-out role came from."""
    return {"eval_source": "file" if cfg.test_data_uri else "split",
            "validation_source": (("file" if cfg.validation_uri else "split")
                                  if has_validation else None)}


def split_rule(cfg: RunConfig, router: Router, rule: str) -> Optional[dict]:
    """The manifest's split_rule when any role was carved from the training data."""
    if router.test is None and router.validation is None:
        return None
    out = {"seed": cfg.seed, "rule": rule}
    if router.test is not None:
        out["eval_fraction"] = cfg.eval_fraction
    if router.validation is not None:
        out["validation_fraction"] = cfg.validation_share
        out["validation_rule"] = ("the same rule over the training rows left after the test "
                                  "split, with its own seeded key")
    return out


def held_out_sources(writers: dict, given: dict, describe) -> dict:
    """The manifest's `sources` entries of the held-out splits: the file each was read from
    (`describe`d), or None where it was carved from the training data."""
    return {split: describe(given[split]) if split in given else None
            for split in writers if split != "train"}
