"""Every family but BERT (whose run is tests/test_dag_e2e.py) through the whole DAG
(dag.test(), the demo data): every task succeeds, the train step built the family, and the
exported version loads in PyTorch transformers' class of its family with the SavedModel's
probabilities. The checkpoints are tiny and random (2 layers, hidden 32). A cased BERT (its
tokenizer_config.json says do_lower_case false) must not be lower-cased. DistilBERT and
ELECTRA (its embeddings narrower than its hidden size) have the real uncased vocabulary, so the
demo's texts tokenize as they would for a pretrained checkpoint; the cased BERT, RoBERTa, XLM-R
and DeBERTa-v3 have the vocabularies their steps tests train (tests/family_checkpoints.py)."""
from __future__ import annotations

import numpy as np
import pytest

from bertflow_airflow.demo import run_dag, run_folder, sample_rows
from tasks.io import storage
from tasks.io.uris import join_uri
from family_checkpoints import BUILDERS, tiny_default_vocab

TINY = {"max_seq_length": 32, "epochs": 1, "max_steps": 4, "per_replica_batch_size": 8,
        "num_shards": 1, "num_workers": 1, "eval_batch_size": 64}
SHAPES = {"distilbert": {}, "electra": {"embedding_size": 16}}


@pytest.fixture(scope="module", params=sorted(SHAPES) + sorted(BUILDERS))
def finished_run(request, airflow_db, tmp_path_factory):
    family = name = request.param
    folder = tmp_path_factory.mktemp(family) / "checkpoint"
    if family in BUILDERS:
        folder.mkdir()
        BUILDERS[family](folder)
        family = family.removesuffix("-cased")
    else:
        tiny_default_vocab(folder, family, **SHAPES[family])
    root = str(tmp_path_factory.mktemp("artifacts"))
    dag_run = run_dag({**TINY, "artifact_root": root, "base_model": str(folder),
                       "model_name": f"tiny-{family}"})
    return family, dag_run, run_folder(dag_run, root), name


def test_every_task_succeeds_and_the_train_step_built_the_family(finished_run):
    family, dag_run, run_uri, _ = finished_run
    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    assert {task: state for task, state in states.items() if state != "success"} == {
        "approval": "skipped"}, states
    trained = storage.read_json(join_uri(run_uri, "train", "manifest.json"))
    assert trained["model_family"] == family


def test_exported_version_loads_in_pytorch_with_the_same_probabilities(finished_run):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the SavedModel's tokenizer ops)

    import torch_env

    try:
        torch_env.python()
    except torch_env.Unavailable as err:
        pytest.skip(str(err))
    family, _, run_uri, _ = finished_run
    version = storage.read_json(join_uri(run_uri, "export", "manifest.json"))["version_uri"]
    config = storage.read_json(join_uri(version, "config.json"))
    assert config["model_type"] == family
    texts = [row["text"] for row in sample_rows(run_uri, count=3)]
    serve = tf.saved_model.load(join_uri(version, "saved_model")).signatures["serving_default"]
    want = serve(text=tf.constant(texts))["probabilities"].numpy()
    got = torch_env.predict(version, texts)
    np.testing.assert_allclose(got["probabilities"], want, atol=1e-5)


# Whether each checkpoint's tokenizer lower-cases, as its files say (tasks/model/casing.py).
LOWER_CASED = {"distilbert": True, "electra": True, "bert-cased": False, "roberta": False,
               "xlm-roberta": False, "deberta-v2": False}


def test_the_casing_is_the_checkpoint_s_through_to_the_export(finished_run):
    """A cased BERT is not lower-cased: the tokenize step reads do_lower_case false from its
    tokenizer_config.json, and the exported checkpoint says so for transformers."""
    _, _, run_uri, name = finished_run
    tokens = storage.read_json(join_uri(run_uri, "tokenize", "manifest.json"))
    assert tokens["lower_case"] is LOWER_CASED[name], tokens["lower_case_rule"]
    if name == "bert-cased":
        assert tokens["lower_case_rule"] == "tokenizer_config.json do_lower_case"
        version = storage.read_json(join_uri(run_uri, "export", "manifest.json"))["version_uri"]
        exported = storage.read_json(join_uri(version, "tokenizer_config.json"))
        assert exported["do_lower_case"] is False
