"""The typed config is the single source for Params, CLI flags and validation."""
import json

import pytest

from tasks.config import PROJECT_ROOT, RunConfig, parse_config, param_schemas
from tasks.errors import ConfigError


def test_defaults_are_valid_and_round_trip_through_json():
    cfg = parse_config({})
    assert parse_config(json.loads(cfg.to_json())) == cfg


@pytest.mark.parametrize("values, field, words", [
    ({"per_replica_batch_size": 0}, "per_replica_batch_size", "greater than or equal to 1"),
    ({"strategy": "horovod"}, "strategy", "'auto', 'one_device'"),
    ({"max_seq_length": 4096}, "max_seq_length", "less than or equal to 512"),
    ({"eval_fraction": 0.9}, "eval_fraction", "less than 0.5"),
    ({"learning_rate": "fast"}, "learning_rate", "valid number"),
    ({"model_name": "../escape"}, "model_name", "pattern"),
    ({"batch": 8}, "batch", "unknown field"),
    ({"strategy": "parameter_server"}, "num_ps", "at least 1 parameter server"),
    ({"strategy": "mirrored", "num_workers": 2}, "num_workers", "runs in one process"),
    ({"strategy": "tpu"}, "tpu_address", "TPU name"),
    ({"strategy": "mirrored", "num_ps": 1}, "num_ps", "only used by parameter_server"),
    ({"grad_accum_steps": 4}, "grad_accum_steps", "needs training_loop custom"),
    ({"training_loop": "custom", "num_ps": 1, "num_workers": 2}, "training_loop",
     "parameter_server trains with fit"),
])
def test_invalid_values_name_the_field_and_reason(values, field, words):
    with pytest.raises(ConfigError) as err:
        parse_config(values)
    assert err.value.field == field
    assert words in str(err.value)
    assert f"'{field}'" in str(err.value)


def test_cross_field_rules():
    with pytest.raises(ConfigError, match="label_column must differ"):
        parse_config({"label_column": "text"})
    with pytest.raises(ConfigError, match="at least 2 classes"):
        parse_config({"labels": ["only"]})


def test_empty_form_values_mean_unset_for_optional_fields():
    cfg = parse_config({"eval_uri": "", "text_pair_column": "", "labels": None,
                        "tpu_zone": None, "gcp_conn_id": ""})
    assert cfg.eval_uri is None and cfg.text_pair_column is None
    assert cfg.tpu_zone == "" and cfg.gcp_conn_id == ""
    with pytest.raises(ConfigError, match="'train_uri'"):
        parse_config({"train_uri": None})


def test_fields_with_empty_defaults_are_not_required_in_the_form():
    # The Airflow trigger form marks a "string" Param whose value is "" as missing.
    for name, schema in param_schemas().items():
        if schema["default"] in ("", None):
            assert "null" in schema["type"], name


def test_param_schemas_cover_every_field_with_title_default_and_type():
    schemas = param_schemas()
    assert set(schemas) == set(RunConfig.model_fields)
    defaults = RunConfig().model_dump()
    for name, schema in schemas.items():
        assert schema["title"], name
        assert schema["default"] == defaults[name], name
        assert "type" in schema or "enum" in schema, name
    assert schemas["strategy"]["enum"][0] == "auto"
    assert schemas["eval_uri"]["type"] == ["string", "null"]
    assert schemas["per_replica_batch_size"]["minimum"] == 1


def test_form_sections_keep_their_fields_together_first_steps_first(monkeypatch):
    from tasks import config

    # The first-time fields carry no section: the form's default box, the one shown open.
    sections = [schema.get("section", config.FIRST_SECTION)
                for schema in param_schemas().values()]
    # Each section is one contiguous run of fields, in SECTIONS order.
    runs = [s for i, s in enumerate(sections) if i == 0 or sections[i - 1] != s]
    assert runs == list(config.SECTIONS) and runs[0] == config.FIRST_SECTION
    first = [name for name, schema in param_schemas().items() if "section" not in schema]
    assert {"train_uri", "eval_uri", "labels", "epochs", "accelerator",
            "num_workers"} <= set(first)
    # A field left out of SECTIONS would vanish from the form: refused loudly instead.
    monkeypatch.setitem(config.SECTIONS, "Data", config.SECTIONS["Data"][1:])
    with pytest.raises(RuntimeError, match="file_format"):
        param_schemas()


def test_param_schemas_validate_their_own_defaults():
    jsonschema = pytest.importorskip("jsonschema")
    for name, schema in param_schemas().items():
        body = {k: v for k, v in schema.items() if k not in ("default", "title", "description")}
        jsonschema.validate(schema["default"], body)


def test_readme_documents_every_param():
    readme = (PROJECT_ROOT / "README.md").read_text()
    missing = [name for name in RunConfig.model_fields if f"| `{name}` |" not in readme]
    assert not missing, f"README's Params table lacks {missing}"
