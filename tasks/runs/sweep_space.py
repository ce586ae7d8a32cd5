"""Search spaces for sweeps: which RunConfig values each trial overrides.

Two forms, both JSON:
  {"grid": {"learning_rate": [3e-5, 5e-5], "seed": [0, 1]}}          every combination
  {"random": {"learning_rate": {"low": 1e-5, "high": 1e-4, "log": true},
              "per_replica_batch_size": [16, 32]}, "trials": 8, "seed": 0}
A random dimension is either a list (uniform choice) or a {low, high[, log]} range.
Every value is checked against RunConfig's own field validation before any compute.
"""
from __future__ import annotations

import itertools
import math
import random
from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError

from tasks.config import RunConfig
from tasks.errors import ConfigError

MAX_TRIALS = 64


def _err(field: str, reason: str) -> ConfigError:
    return ConfigError(f"search_space.{field}", reason)


def _check_value(kind: str, name: str, value: Any) -> Any:
    where = f"{kind}.{name}"
    info = RunConfig.model_fields.get(name)
    if info is None:
        raise _err(where, "not a RunConfig field; use a field name from docs/params.md")
    try:
        return TypeAdapter(Annotated[info.annotation, info]).validate_python(value)
    except ValidationError as exc:
        msg = exc.errors()[0]["msg"]
        raise _err(where, f"value {value!r} refused: {msg}; change or drop it") from None


def _grid(dims: Any) -> list[dict]:
    if not isinstance(dims, dict) or not dims:
        raise _err("grid", "empty; give at least one field with a non-empty list of values")
    values = {}
    for name, vals in dims.items():
        if not isinstance(vals, list) or not vals:
            raise _err(f"grid.{name}", "must be a non-empty list of values")
        values[name] = [_check_value("grid", name, v) for v in vals]
    names = list(values)
    return [dict(zip(names, combo)) for combo in itertools.product(*values.values())]


def _random(space: dict) -> list[dict]:
    dims = space["random"]
    if not isinstance(dims, dict) or not dims:
        raise _err("random", "empty; give at least one field with a list or {low, high} range")
    n = space.get("trials")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise _err("trials", f"{n!r} is not a positive integer; set how many random trials to run")
    seed = space.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise _err("seed", f"{seed!r} is not an integer")
    samplers = {}
    for name, dim in dims.items():
        where = f"random.{name}"
        if isinstance(dim, list):
            if not dim:
                raise _err(where, "empty list; give values to choose from")
            samplers[name] = ("choice", [_check_value("random", name, v) for v in dim])
        elif isinstance(dim, dict) and "low" in dim and "high" in dim:
            extra = set(dim) - {"low", "high", "log"}
            if extra:
                raise _err(where, f"unknown keys {sorted(extra)}; use low, high, log")
            low, high, log = dim["low"], dim["high"], bool(dim.get("log", False))
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (low, high)) \
                    or low >= high:
                raise _err(where, f"range needs numbers low < high, got low={low!r} high={high!r}")
            if log and low <= 0:
                raise _err(where, "log range needs low > 0")
            _check_value("random", name, low)
            _check_value("random", name, high)
            is_int = RunConfig.model_fields[name].annotation is int
            samplers[name] = ("range", (low, high, log, is_int))
        else:
            raise _err(where, "must be a list of values or {\"low\": .., \"high\": .., \"log\": bool}")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        trial = {}
        for name, (kind, arg) in samplers.items():
            if kind == "choice":
                trial[name] = arg[rng.randrange(len(arg))]
            else:
                low, high, log, is_int = arg
                x = math.exp(rng.uniform(math.log(low), math.log(high))) if log \
                    else rng.uniform(low, high)
                x = int(round(x)) if is_int else float(f"{x:.6g}")
                trial[name] = _check_value("random", name, x)
        out.append(trial)
    return out


def trials(space: Any) -> list[dict]:
    """The trial overrides of `space`, in a deterministic order; ConfigError if invalid."""
    if not isinstance(space, dict):
        raise ConfigError("search_space", "must be an object with a 'grid' or 'random' key")
    kinds = [k for k in ("grid", "random") if k in space]
    if len(kinds) != 1:
        raise ConfigError("search_space", "give exactly one of 'grid' or 'random'")
    allowed = {"grid"} if kinds == ["grid"] else {"random", "trials", "seed"}
    extra = set(space) - allowed
    if extra:
        raise _err(sorted(extra)[0], f"unknown key; a {kinds[0]} space takes {sorted(allowed)}")
    out = _grid(space["grid"]) if kinds == ["grid"] else _random(space)
    if len(out) > MAX_TRIALS:
        raise _err(kinds[0], f"{len(out)} trials exceed the cap of {MAX_TRIALS}; "
                             "use fewer values or a random space with fewer trials")
    return out


def label(values: dict) -> str:
    """Short human label of one trial, e.g. 'learning_rate=3e-05 seed=1'."""
    return " ".join(f"{k}={v}" for k, v in values.items())
