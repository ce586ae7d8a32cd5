"""The typed config is the single source for Params (tasks/params_form.py), CLI flags and
validation."""
import json

import pytest

from tasks.config import PROJECT_ROOT, RunConfig, parse_config
from tasks.params_form import param_schemas
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
    ({"deterministic": True, "num_ps": 1, "num_workers": 2}, "deterministic",
     "in no fixed order"),
])
def test_invalid_values_name_the_field_and_reason(values, field, words):
    with pytest.raises(ConfigError) as err:
        parse_config(values)
    assert err.value.field == field
    assert words in str(err.value)
    assert f"'{field}'" in str(err.value)


def test_deterministic_is_off_by_default_and_allowed_where_runs_can_repeat():
    assert parse_config({}).deterministic is False
    for values in ({}, {"num_workers": 2}, {"num_ps": 1, "num_workers": 1}):
        assert parse_config({**values, "deterministic": True}).deterministic is True


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
    from tasks import params_form as form

    # The first-time fields carry no section: the form's default box, the one shown open.
    sections = [schema.get("section", form.FIRST_SECTION)
                for schema in param_schemas().values()]
    # Each section is one contiguous run of fields, in SECTIONS order.
    runs = [s for i, s in enumerate(sections) if i == 0 or sections[i - 1] != s]
    assert runs == list(form.SECTIONS) and runs[0] == form.FIRST_SECTION
    first = [name for name, schema in param_schemas().items() if "section" not in schema]
    assert {"train_uri", "test_uri", "labels", "epochs", "accelerator",
            "num_workers"} <= set(first)
    # A field left out of SECTIONS would vanish from the form: refused loudly instead.
    monkeypatch.setitem(form.SECTIONS, "Data", form.SECTIONS["Data"][1:])
    with pytest.raises(RuntimeError, match="file_format"):
        param_schemas()


def test_param_schemas_validate_their_own_defaults():
    jsonschema = pytest.importorskip("jsonschema")
    for name, schema in param_schemas().items():
        body = {k: v for k, v in schema.items() if k not in ("default", "title", "description")}
        jsonschema.validate(schema["default"], body)


def test_params_reference_is_the_generated_one_and_documents_every_param():
    """docs/params.md is what `python -m tasks.params_doc` writes from RunConfig: a field
    added, renamed or re-described without regenerating the page fails here."""
    from tasks import params_doc

    page = (PROJECT_ROOT / "docs" / "params.md").read_text()
    missing = [name for name in RunConfig.model_fields if f"| `{name}` |" not in page]
    assert not missing, f"docs/params.md lacks {missing}"
    assert page == params_doc.render(), (
        "docs/params.md is stale: run .venv/bin/python -m tasks.params_doc")
    assert "params.md" in (PROJECT_ROOT / "README.md").read_text()  # linked from the README


def test_params_reference_shows_titles_types_defaults_and_ranges():
    page = (PROJECT_ROOT / "docs" / "params.md").read_text()
    assert ("| `epochs` | integer | `3` | Epochs. Range: >= 1, <= 1000. |" in page)
    assert "| `eval_fraction` | number | `0.1` | Held-out test fraction." in page
    assert "Range: > 0.0, < 0.5. |" in page
    assert "| `accelerator` | `auto` \\| `cpu` \\| `gpu` \\| `tpu` | `auto` |" in page
    # no path of this machine: the demo file as the checkout names it, the root as a rule
    assert "| `train_uri` | string | `examples/demo/train.tsv` |" in page
    assert str(PROJECT_ROOT) not in page and "$BERTFLOW_ARTIFACT_ROOT" in page
    sections = [line[3:] for line in page.splitlines() if line.startswith("## ")]
    from tasks.params_form import SECTIONS
    assert sections == list(SECTIONS)


def test_params_doc_check_fails_on_a_stale_page(tmp_path, monkeypatch, capsys):
    from tasks import params_doc

    stale = tmp_path / "params.md"
    stale.write_text(params_doc.render().replace("Range: >= 1, <= 1000.", "Range: >= 1."))
    monkeypatch.setattr(params_doc, "DOC", stale)
    monkeypatch.setattr(params_doc, "PROJECT_ROOT", tmp_path)
    assert params_doc.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().err
    assert params_doc.main([]) == 0 and params_doc.main(["--check"]) == 0


def test_a_train_file_alone_is_split_in_the_cli_the_form_and_the_dag_alike(tmp_path):
    """No eval file by default: the trigger form's default, the CLI's and the DAG's Param
    defaults all leave eval_uri empty, so the data step holds out eval_fraction of the train
    file (make demo passes the demo's own eval file)."""
    from bertflow_airflow.demo import DEMO_CONF
    from tasks.config import DEMO_DIR

    assert RunConfig().eval_uri is None
    defaults = {name: schema["default"] for name, schema in param_schemas().items()}
    assert defaults["eval_uri"] is None  # what the trigger form shows
    assert parse_config({**defaults, "train_uri": str(tmp_path / "mine.tsv")}).eval_uri is None
    assert DEMO_CONF["eval_uri"] == str(DEMO_DIR / "eval.tsv")
    assert parse_config(DEMO_CONF).train_uri == str(DEMO_DIR / "train.tsv")


# --- the three data roles and what needs validation ---------------------------------------
@pytest.mark.parametrize("values, field, words", [
    ({"test_uri": "/d/test.tsv", "eval_uri": "/d/other.tsv"}, "(config)", "set test_uri only"),
    ({"validation_uri": "/d/t.tsv", "test_uri": "/d/t.tsv"}, "(config)", "validation steers"),
    ({"early_stopping_patience": 2}, "(config)", "set eval_every_steps or eval_every_epoch"),
    ({"best_checkpoint": True}, "(config)", "needs evaluation during training"),
    ({"eval_every_steps": 50, "validation_fraction": 0}, "(config)", "set validation_uri"),
    ({"eval_every_steps": 50, "max_steps": 20}, "(config)", "more than max_steps 20"),
])
def test_settings_that_cannot_work_are_refused_with_the_fix(values, field, words):
    with pytest.raises(ConfigError) as err:
        parse_config(values)
    assert err.value.field == field and words in str(err.value)


def test_eval_uri_is_the_test_role_and_validation_is_held_out_only_when_used():
    assert parse_config({"eval_uri": "/d/t.tsv"}).test_data_uri == "/d/t.tsv"
    assert parse_config({"test_uri": "/d/t.tsv", "eval_uri": "/d/t.tsv"}).test_data_uri
    plain = parse_config({})
    assert plain.validation_share == 0 and not plain.keeps_best_checkpoint
    validated = parse_config({"eval_every_epoch": True})
    assert validated.validation_share == 0.1 and validated.keeps_best_checkpoint
    assert not parse_config({"eval_every_steps": 10, "best_checkpoint": False}) \
        .keeps_best_checkpoint
    assert parse_config({"eval_every_steps": 10, "validation_uri": "/d/v.tsv"}) \
        .validation_share == 0


# Names of Kubernetes objects, masked by Airflow's default list ("service_account", "secret"):
# neither is a secret, but the form and the REST API show them as *** once set. Renaming
# them would break users' configs; a new Param must not join them.
MASKED_BY_AIRFLOW = {"service_account", "image_pull_secrets"}


def test_airflow_masks_no_param_but_the_known_ones():
    """Airflow's secrets masker hides the value of any key whose name holds a sensitive word
    ("token", "secret", "password"...) in the trigger form, the REST API and the logs: a
    Param named token_loss_normalizer came back as '***' from a real standalone run."""
    from airflow.sdk._shared.secrets_masker.secrets_masker import should_hide_value_for_key

    from tasks.score_config import ScoreConfig

    names = set(RunConfig.model_fields) | set(ScoreConfig.model_fields)
    assert {n for n in names if should_hide_value_for_key(n)} == MASKED_BY_AIRFLOW
    assert should_hide_value_for_key("token_loss_normalizer")  # the check can fail


# --- each form schema names JSON Schema draft 7 and means the same under 2020-12 -------------
# Airflow validates a Param with jsonschema.validate, which picks the validator by the schema's
# "$schema" (tasks/params_form.py, DRAFT): draft 7 as shipped, 2020-12 (the default) without.
DRAFT_07 = "http://json-schema.org/draft-07/schema#"
# Values of every JSON type, for every field: the form takes any JSON, whatever the field.
SPREAD = [None, "", "x", "none", "auto", "embeddings+2", "../escape", "2x2", "a" * 65,
          "a" * 2049, "1e-5", 0, 1, -1, 2, 7, 513, 10**6, 0.0, 0.5, 1.0, 2.0, -0.5, 1e-5, 1.5,
          True, False, [], ["a"], [1], ["a", 2], {}, {"k": "v"}, {"k": 1},
          {"grid": {"learning_rate": [3e-5]}}, {"random": {"seed": [0]}, "trials": 2}]


def _values(schema: dict) -> list:
    """SPREAD, the schema's default and enum, and each bound's value, either side of it."""
    values = [*SPREAD, schema["default"], *schema.get("enum", ())]
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if key in schema:
            values += [schema[key] + d for d in (-1, -0.5, -1e-9, 0, 1e-9, 0.5, 1)]
    return values


def _body(schema: dict) -> dict:
    """The schema as Param keeps it: param_schemas()' keyword arguments less its default and
    description."""
    return {k: v for k, v in schema.items() if k not in ("default", "description")}


def _disagreements(schema: dict) -> list:
    """The values that the shipped schema (draft 7) and the same schema without "$schema"
    (2020-12, as before it named its draft) do not both accept or both refuse."""
    import jsonschema
    from jsonschema import Draft7Validator, Draft202012Validator, FormatChecker

    body = _body(schema)
    bare = {k: v for k, v in body.items() if k != "$schema"}
    assert jsonschema.validators.validator_for(body) is Draft7Validator
    assert jsonschema.validators.validator_for(bare) is Draft202012Validator
    Draft7Validator.check_schema(body)
    Draft202012Validator.check_schema(bare)
    seven = Draft7Validator(body, format_checker=FormatChecker())
    newest = Draft202012Validator(bare, format_checker=FormatChecker())
    assert seven.is_valid(schema["default"]) and newest.is_valid(schema["default"])
    return [v for v in _values(schema) if seven.is_valid(v) != newest.is_valid(v)]


def _form_schemas() -> dict[str, dict]:
    """Every trigger form's Param schemas: bert_finetune's (and bert_sweep's and the
    janitor's), bert_batch_score's, and the sweep's own three from dags/bert_sweep.py."""
    import importlib.util

    from tasks.params_form import score_param_schemas

    spec = importlib.util.spec_from_file_location("_bert_sweep_dag",
                                                  PROJECT_ROOT / "dags" / "bert_sweep.py")
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    return {**{f"run {n}": s for n, s in param_schemas().items()},
            **{f"score {n}": s for n, s in score_param_schemas().items()},
            **{f"sweep {n}": {**p.schema, "default": p.value, "description": p.description}
               for n, p in sweep.SWEEP_PARAMS.items()}}


def test_every_form_schema_names_draft_7_and_means_the_same_under_2020_12():
    schemas = _form_schemas()
    assert len([n for n in schemas if n.startswith("sweep ")]) == 3
    assert {n for n, s in schemas.items() if s.get("$schema") != DRAFT_07} == set()
    different = {n: d for n, s in schemas.items() if (d := _disagreements(s))}
    assert different == {}
    # the values reach both answers in every kind of field (not all refused, not all taken)
    import jsonschema

    for name, schema in schemas.items():
        answers = {jsonschema.Draft7Validator(_body(schema)).is_valid(v)
                   for v in _values(schema)}
        assert answers == {True, False}, name


@pytest.mark.parametrize("field, keyword", [
    ("labels", {"prefixItems": [{"type": "integer"}]}),  # 2020-12's; draft 7 ignores it
    ("node_selector", {"dependencies": {"k": ["grid"]}}),  # draft 7's; 2020-12 ignores it
    # draft 7 ignores a $ref's siblings (here the field's type and bounds), 2020-12 applies them
    ("epochs", {"$ref": "#/definitions/n", "definitions": {"n": {}}}),
])
def test_the_draft_check_finds_a_keyword_the_drafts_read_apart(field, keyword):
    schema = param_schemas()[field]
    assert not _disagreements(schema)
    assert _disagreements({**schema, **keyword})
