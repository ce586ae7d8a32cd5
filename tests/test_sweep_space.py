import pytest

from tasks.errors import ConfigError
from tasks.runs import sweep_space
from tasks.runs.sweep_space import label, trials


def test_grid_expands_every_combination():
    got = trials({"grid": {"learning_rate": [3e-5, 5e-5], "seed": [0, 1]}})
    assert got == [
        {"learning_rate": 3e-5, "seed": 0}, {"learning_rate": 3e-5, "seed": 1},
        {"learning_rate": 5e-5, "seed": 0}, {"learning_rate": 5e-5, "seed": 1},
    ]
    assert label(got[1]) == "learning_rate=3e-05 seed=1"


def test_random_is_reproducible_by_seed_and_within_range():
    space = {"random": {"learning_rate": {"low": 1e-5, "high": 1e-4, "log": True},
                        "per_replica_batch_size": [16, 32]}, "trials": 8, "seed": 0}
    a, b = trials(space), trials(dict(space))
    assert a == b and len(a) == 8
    assert all(1e-5 <= t["learning_rate"] <= 1e-4 for t in a)
    assert {t["per_replica_batch_size"] for t in a} <= {16, 32}
    assert trials({**space, "seed": 1}) != a


@pytest.mark.parametrize("space, field", [
    ({"grid": {"learnin_rate": [1e-5]}}, "search_space.grid.learnin_rate"),
    ({"grid": {"learning_rate": [2.0]}}, "search_space.grid.learning_rate"),
    ({"grid": {"seed": []}}, "search_space.grid.seed"),
    ({"grid": {}}, "search_space.grid"),
    ({}, "search_space"),
    ({"grid": {"seed": list(range(65))}}, "search_space.grid"),
    ({"random": {"learning_rate": {"low": 1e-5, "high": 1e-4}}, "trials": 100}, "search_space.random"),
    ({"random": {"learning_rate": {"low": 1e-5, "high": 1e-4}}}, "search_space.trials"),
    ({"random": {"learning_rate": {"low": -1.0, "high": 1e-4}}, "trials": 2},
     "search_space.random.learning_rate"),
    ({"random": {"epochs": [0]}, "trials": 2}, "search_space.random.epochs"),
])
def test_every_error_names_the_field(space, field):
    with pytest.raises(ConfigError) as exc:
        trials(space)
    assert exc.value.field == field
    assert field in str(exc.value)


def test_cap_is_64():
    assert sweep_space.MAX_TRIALS == 64
    assert len(trials({"grid": {"seed": list(range(64))}})) == 64
