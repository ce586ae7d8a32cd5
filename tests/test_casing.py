"""A checkpoint's casing is read from the checkpoint (tasks/model/casing.py): cased vocabularies
are no longer lower-cased, a contradicting lower_case is refused at validate, and the HF export
records what the tokenizer did. The cased vocabulary is trained here with the tokenizers
library on text with capitals, accents, CJK and emoji; transformers' BertTokenizer is the
reference it must match."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tasks.config import RunConfig
from tasks.errors import ConfigError
from tasks.model import casing
from tasks.training import checkpoint
from train_helpers import write_tiny_model

CORPUS = [
    "The Quick Brown Fox jumps over Zoë's café in São Paulo.",
    "Müller sagte: die Straße ist NASS!",
    "東京は日本の首都です。北京也是首都。",
    "I love it 😀🎉 so MUCH, said Ana.",
    "NASA and the E.U. agreed; a naïve résumé from Émile.",
    "ÉCOLE École école, Ωmega and ωmega",
    "New York's MoMA opened at 9am; Dr. Smith-Jones arrived late.",
]
UNSEEN = [
    "Zoe met ZOË at the CAFÉ near Sao Paulo",
    "Straße vs STRASSE vs strasse",
    "e\u0301cole written decomposed, and École",
    "京都と東京 😀 Émile",
    "ALL CAPS AND lower AND MiXeD",
    "Über, uber, ÜBER; Ñandú",
]


@pytest.fixture(scope="module")
def cased_vocab(tmp_path_factory) -> Path:
    from tokenizers import BertWordPieceTokenizer

    out = tmp_path_factory.mktemp("cased")
    trainer = BertWordPieceTokenizer(lowercase=False, strip_accents=False, clean_text=True,
                                     handle_chinese_chars=True)
    trainer.train_from_iterator(CORPUS * 20, vocab_size=600, min_frequency=1,
                                special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    trainer.save_model(str(out))
    return out / "vocab.txt"


def test_the_in_graph_tokenizer_matches_transformers_on_a_cased_vocabulary(cased_vocab):
    """Cased (the uncased path is tests/test_tokenize.py's, on MiniLM's vocabulary)."""
    import transformers

    from tasks.model.text_encoder import BertTextEncoder

    reference = transformers.BertTokenizer(vocab=str(cased_vocab), do_lower_case=False)
    encoder = BertTextEncoder(cased_vocab, lower_case=False, max_seq_length=64)
    texts = CORPUS + UNSEEN
    ids, _ = encoder.encode(texts)
    for text, got in zip(texts, ids.to_list()):
        assert got == reference(text)["input_ids"], text
    # Capitals and accents reach their own pieces, which lower-casing would never produce.
    pieces = {reference.convert_ids_to_tokens(i) for row in ids.to_list() for i in row}
    assert any(c.isupper() for p in pieces for c in p if p not in ("[CLS]", "[SEP]"))
    assert any(c in "ÉéëüÜ" for p in pieces for c in p)


def test_each_rule_in_order():
    def reader(files: dict):
        return lambda name: files.get(name)

    cased_vocab = "\n".join(["[PAD]", "[UNK]", "The", "Paris", "the", "##s"]).encode()
    uncased_vocab = "\n".join(["[PAD]", "[UNK]", "the", "paris", "##s"]).encode()
    config = json.dumps({"do_lower_case": False}).encode()
    normalizer = json.dumps({"normalizer": {"type": "BertNormalizer", "lowercase": True,
                                            "strip_accents": None}}).encode()
    found = casing.from_files(reader({"tokenizer_config.json": config,
                                      "tokenizer.json": normalizer,
                                      "vocab.txt": uncased_vocab}), "bert", "ckpt")
    assert (found.lower_case, found.rule) == (False, "tokenizer_config.json do_lower_case")
    found = casing.from_files(reader({"tokenizer.json": normalizer,
                                      "vocab.txt": cased_vocab}), "bert", "ckpt")
    assert (found.lower_case, found.rule) == (True, "tokenizer.json normalizer")
    sequence = json.dumps({"normalizer": {"type": "Sequence", "normalizers": [
        {"type": "NFD"}, {"type": "Lowercase"}, {"type": "StripAccents"}]}}).encode()
    assert casing.from_files(reader({"tokenizer.json": sequence}), "bert", "c").lower_case
    found = casing.from_files(reader({"vocab.txt": cased_vocab}), "bert", "ckpt")
    assert not found.lower_case and found.rule.startswith("vocab.txt: 2 of 4 pieces")
    found = casing.from_files(reader({"vocab.txt": uncased_vocab}), "electra", "ckpt")
    assert found.lower_case and found.from_checkpoint and "no capitalised" in found.rule
    # A vocabulary with a stray capital says nothing: the family's default decides.
    stray = "\n".join(["the", "Paris"] + [f"w{i}" for i in range(300)]).encode()
    found = casing.from_files(reader({"vocab.txt": stray}), "distilbert", "ckpt")
    assert found.lower_case and not found.from_checkpoint
    assert found.rule == "distilbert default (the checkpoint does not say)"


def test_a_checkpoint_whose_accents_follow_other_rules_is_refused():
    config = json.dumps({"do_lower_case": False, "strip_accents": True}).encode()
    with pytest.raises(ConfigError) as err:
        casing.from_files({"tokenizer_config.json": config}.get, "bert", "gs://b/ckpt")
    assert err.value.field == "base_model"
    assert "gs://b/ckpt/tokenizer_config.json: strip_accents true with lower-casing off" in str(
        err.value)
    with pytest.raises(ConfigError, match="tokenizer.json is not JSON"):
        casing.from_files({"tokenizer.json": b"{"}.get, "bert", "ckpt")


def test_lower_case_against_the_checkpoint():
    cased = casing.Casing(False, "tokenizer_config.json do_lower_case", True)
    assert casing.decide(None, False, cased) == cased
    assert casing.decide(False, False, cased) == cased
    with pytest.raises(ConfigError) as err:
        casing.decide(True, False, cased)
    message = str(err.value)
    assert err.value.field == "lower_case"
    assert "true contradicts the checkpoint (tokenizer_config.json do_lower_case: cased)" in (
        message) and "lower_case_override" in message
    forced = casing.decide(True, True, cased)
    assert forced.lower_case and "set for the run" in forced.rule
    # Where only the family's default spoke, the run's value is not a contradiction.
    default = casing.Casing(True, "bert default (the checkpoint does not say)", False)
    assert not casing.decide(False, False, default).lower_case


@pytest.fixture(scope="module")
def cased_checkpoint(tmp_path_factory, cased_vocab) -> Path:
    """The tiny random BERT with the cased vocabulary and transformers' tokenizer files."""
    import transformers

    vocab = cased_vocab.read_text().splitlines()
    folder = write_tiny_model(tmp_path_factory.mktemp("cased-ckpt") / "model",
                              vocab_size=len(vocab))
    shutil.copy(cased_vocab, folder / "vocab.txt")
    transformers.BertTokenizer(vocab=str(cased_vocab), do_lower_case=False).save_pretrained(
        folder)
    return folder


def _train_file(tmp_path: Path) -> str:
    path = tmp_path / "train.tsv"
    path.write_text("text\tlabel\n" + "".join(f"{t}\t{'ab'[i % 2]}\n"
                                               for i, t in enumerate(CORPUS * 6)))
    return str(path)


def test_validate_pins_the_checkpoint_s_casing_and_refuses_a_contradiction(tmp_path,
                                                                             cased_checkpoint):
    from tasks.steps import validate

    base = {"base_model": str(cased_checkpoint), "train_uri": _train_file(tmp_path),
            "artifact_root": str(tmp_path / "art")}
    assert RunConfig(**base).lower_case is None
    assert validate.check_inputs_and_model(RunConfig(**base)).lower_case is False
    with pytest.raises(ConfigError) as err:
        validate.check_inputs_and_model(RunConfig(**base, lower_case=True))
    assert err.value.field == "lower_case" and "tokenizer_config.json" in str(err.value)
    assert not (tmp_path / "art").exists()  # refused before any run folder
    forced = validate.check_inputs_and_model(
        RunConfig(**base, lower_case=True, lower_case_override=True))
    assert forced.lower_case is True
    # The offline default (MiniLM, uncased) keeps lower-casing.
    default = validate.check_inputs_and_model(
        RunConfig(train_uri=base["train_uri"], artifact_root=base["artifact_root"]))
    assert default.lower_case is True


def test_a_cased_run_tokenizes_cased_and_its_export_records_it(tmp_path, cased_checkpoint):
    """The data and tokenize steps of a cased checkpoint with lower_case empty: the manifest
    says which rule decided, the TFRecords hold the cased pieces, and the HF tokenizer the
    export writes from that manifest (export.write_hf_checkpoint's call) records
    do_lower_case false, so the exported folder reads as cased again."""
    import tensorflow as tf
    import transformers

    from tasks.runs.runlayout import RunContext
    from tasks.steps import data, tokenize

    cfg = RunConfig(base_model=str(cased_checkpoint), train_uri=_train_file(tmp_path),
                    num_shards=1, artifact_root=str(tmp_path / "art"), max_seq_length=48)
    ctx = RunContext(str(tmp_path / "art"), "dag", "cased")
    data.run(cfg, ctx)
    manifest = json.loads(Path(tokenize.run(cfg, ctx)).read_text())
    assert manifest["lower_case"] is False
    assert manifest["lower_case_rule"] == "tokenizer_config.json do_lower_case"
    reference = transformers.BertTokenizer(vocab=str(cased_checkpoint / "vocab.txt"),
                                           do_lower_case=False, model_max_length=48)
    records = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(
        manifest["splits"]["train"]["shards"] + manifest["splits"]["eval"]["shards"])]
    stored = {tuple(r.features.feature["input_ids"].int64_list.value) for r in records}
    assert stored == {tuple(reference(t, truncation=True)["input_ids"]) for t in CORPUS}

    from tasks.steps import export

    model = checkpoint.load_classifier(cased_checkpoint, manifest["labels"])
    exported = tmp_path / "export"
    exported.mkdir()
    export.write_hf_checkpoint(model, manifest["labels"], cased_checkpoint, exported,
                               manifest["lower_case"], manifest["max_seq_length"])
    again = casing.read(exported, "bert")
    assert (again.lower_case, again.rule) == (False, "tokenizer_config.json do_lower_case")
    served = transformers.AutoTokenizer.from_pretrained(str(exported))
    assert served("École")["input_ids"] == reference("École")["input_ids"]


def test_the_data_step_reads_the_casing_where_validate_could_not(cased_checkpoint):
    """lower_case left empty (validate could not read a remote worker's path): the data
    step's leakage check asks the checkpoint."""
    cfg = RunConfig(base_model=str(cased_checkpoint))
    assert cfg.lower_case is None and checkpoint.lower_case(cfg) is False
    assert checkpoint.lower_case(RunConfig(base_model=str(cased_checkpoint),
                                           lower_case=True, lower_case_override=True))
