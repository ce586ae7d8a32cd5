"""The whole DAG through dag.test() on the demo data set, with a tiny but real config: the real
MiniLM checkpoint, two worker processes (MultiWorkerMirroredStrategy), a few steps."""
from __future__ import annotations

import pytest

from tasks.io import storage
from tasks.io.uris import join_uri
from tasks.provision.worker_logs import logs_uri
from bertflow_airflow.demo import predict_in_fresh_process, run_dag, run_folder, sample_rows

TINY = {"max_seq_length": 32, "epochs": 1, "max_steps": 6, "per_replica_batch_size": 8,
        "num_shards": 2, "num_workers": 2, "eval_batch_size": 32}


@pytest.fixture(scope="module")
def finished_run(airflow_db, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("artifacts"))
    dag_run = run_dag({**TINY, "artifact_root": root})
    return dag_run, run_folder(dag_run, root)


def test_every_task_succeeds(finished_run):
    dag_run, _ = finished_run
    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    assert states == {**{task_id: "success" for task_id in (
        "validate", "prepare_data", "tokenize", "provision", "train", "evaluate", "release",
        "export", "gate_eval", "gate", "log_to_mlflow", "promote")},
        "approval": "skipped"}  # require_approval is off
    assert dag_run.state == "success"


def test_steps_wrote_their_manifests(finished_run):
    _, run_uri = finished_run
    manifest = {step: storage.read_json(join_uri(run_uri, step, "manifest.json"))
                for step in ("provision", "train", "evaluate", "export", "promote", "release")}
    assert manifest["provision"]["cluster"] == {"worker": 2}
    assert manifest["train"]["strategy"] == "multi_worker_mirrored"
    assert manifest["train"]["num_replicas"] == 2
    assert 0.0 <= manifest["evaluate"]["metrics"]["accuracy"] <= 1.0
    # The train step's workers evaluated the model in memory (evaluate_in_train); the
    # evaluate task published that and started no workers (train's did write logs).
    assert manifest["evaluate"]["evaluated_in"] == "train"
    assert manifest["evaluate"]["strategy"] == "multi_worker_mirrored"
    assert manifest["train"]["evaluation"]["num_examples"] == manifest["evaluate"]["num_examples"]
    assert storage.list_uris(logs_uri(run_uri, "train"))
    assert not storage.list_uris(logs_uri(run_uri, "evaluate"))
    assert manifest["promote"]["promoted"] is True  # first model, gate minimum 0
    assert manifest["release"]["killed_pids"] == []  # controllers cleaned up themselves


def test_exported_model_predicts_label_names_from_raw_strings(finished_run):
    _, run_uri = finished_run
    exported = storage.read_json(join_uri(run_uri, "export", "manifest.json"))
    labels = storage.read_json(join_uri(exported["version_uri"], "labels.json"))
    rows = sample_rows(run_uri, count=3) + [{"text": "completely unrelated words"}]
    predictions = predict_in_fresh_process(join_uri(exported["version_uri"], "saved_model"),
                                           rows)
    assert len(predictions) == 4
    for pred in predictions:
        assert pred["label"] in labels
        assert sum(pred["probabilities"]) == pytest.approx(1.0, abs=1e-3)


def test_exported_real_model_loads_in_pytorch_with_the_same_probabilities(finished_run):
    """The real MiniLM's version folder as a Hugging Face checkpoint: PyTorch transformers
    (tests/torch_env.py) gives the SavedModel's probabilities within 1e-5, on demo rows and on
    accents and punctuation (the uncased vocabulary's normalisation on both sides)."""
    import numpy as np

    import torch_env

    try:
        torch_env.python()
    except torch_env.Unavailable as err:
        pytest.skip(str(err))
    _, run_uri = finished_run
    version = storage.read_json(join_uri(run_uri, "export", "manifest.json"))["version_uri"]
    rows = sample_rows(run_uri, count=3) + [{"text": "Café naïve RÉSUMÉ — crème brûlée!!"}]
    texts = [row["text"] for row in rows]
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the SavedModel's tokenizer ops)

    serve = tf.saved_model.load(join_uri(version, "saved_model")).signatures["serving_default"]
    want = serve(text=tf.constant(texts))["probabilities"].numpy()  # unrounded
    got = torch_env.predict(version, texts)
    labels = storage.read_json(join_uri(version, "labels.json"))
    assert got["id2label"] == {str(i): label for i, label in enumerate(labels)}
    np.testing.assert_allclose(got["probabilities"], want, atol=1e-5)


def test_promotion_emitted_an_asset_event(finished_run):
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session

    dag_run, run_uri = finished_run
    exported = storage.read_json(join_uri(run_uri, "export", "manifest.json"))
    with create_session() as session:
        events = session.query(AssetEvent).filter_by(source_run_id=dag_run.run_id).all()
        assert [e.asset.name for e in events] == ["bertflow-model-bert-classifier"]
        assert events[0].extra["version_uri"] == exported["version_uri"]


# The gate scoring the champion on a second run's test rows: tests/test_gate_scenario.py
# (three tiny-model runs of one model, the gate passing and refusing; a second MiniLM run
# here cost a whole DAG run).
