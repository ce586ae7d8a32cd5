"""A checkpoint's casing is read from the checkpoint (tasks/model/casing.py): cased vocabularies
are no longer lower-cased, a contradicting lower_case is refused at validate, accents follow
the checkpoint's strip_accents where it sets them apart from the casing, and the HF export
records what the tokenizer did. The cased vocabulary is trained here with the tokenizers
library on text with capitals, accents, CJK and emoji; transformers' BertTokenizer is the
reference it must match. A cased checkpoint also runs token classification end to end."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tasks.config import RunConfig
from tasks.errors import ConfigError
from tasks.model import casing
from tasks.training import checkpoint
from family_checkpoints import CASED_CORPUS
from train_helpers import SERVED, entities_as_the_pipeline, token_steps_of_a_family

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
    from family_checkpoints import cased_vocab

    return cased_vocab(tmp_path_factory.mktemp("cased"))


def test_the_in_graph_tokenizer_matches_transformers_on_a_cased_vocabulary(cased_vocab):
    """Cased (the uncased path is tests/test_tokenize.py's, on MiniLM's vocabulary)."""
    import transformers

    from tasks.model.text_encoder import BertTextEncoder

    reference = transformers.BertTokenizer(vocab=str(cased_vocab), do_lower_case=False)
    encoder = BertTextEncoder(cased_vocab, lower_case=False, max_seq_length=64)
    texts = CASED_CORPUS + UNSEEN
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


def test_the_families_that_fix_the_case():
    """families.py's casing rules: NO_OPTION ignores the files, CASED_ONLY reads them but
    refuses lower-casing, and each names its row's reason where the files say nothing."""
    from tasks.model.families import CASED_ONLY, FAMILIES, FROM_CHECKPOINT, NO_OPTION, Family

    lower = {"tokenizer_config.json": json.dumps({"do_lower_case": True}).encode()}
    assert FAMILIES["roberta"].casing == NO_OPTION
    assert casing.from_files(lower.get, "roberta", "ckpt") == casing.Casing(
        False, "roberta: byte-level BPE reads text as it is", True)
    assert FAMILIES["deberta-v2"].casing == CASED_ONLY
    assert casing.from_files({}.get, "deberta-v2", "ckpt") == casing.Casing(
        False, "deberta-v2: its SentencePiece model reads text as it is "
               "(DebertaV2Tokenizer's default)", True)
    cased = {"tokenizer_config.json": json.dumps({"do_lower_case": False}).encode()}
    assert casing.from_files(cased.get, "deberta-v2", "ckpt").rule == (
        "tokenizer_config.json do_lower_case")
    with pytest.raises(ConfigError, match="ckpt/tokenizer_config.json: do_lower_case true"):
        casing.from_files(lower.get, "deberta-v2", "ckpt")
    assert FAMILIES["bert"].casing == FROM_CHECKPOINT
    assert casing.from_files(lower.get, "bert", "ckpt").lower_case
    # A rule that fixes the case says why; one that reads the checkpoint has nothing to say.
    for rule, reason in ((NO_OPTION, None), (CASED_ONLY, None), (FROM_CHECKPOINT, "why"),
                         ("upper", "why")):
        with pytest.raises(ValueError, match="casing"):
            Family("x", "x/x", "X", casing=rule, casing_reason=reason)


def test_accents_are_read_apart_from_the_casing():
    """strip_accents from the file that gave the casing; None where it follows lower_case."""
    def found(name: str, content: dict) -> casing.Casing:
        return casing.from_files({name: json.dumps(content).encode()}.get, "bert", "ckpt")

    kept = found("tokenizer_config.json", {"do_lower_case": True, "strip_accents": False})
    assert (kept.lower_case, kept.strip_accents, kept.strips_accents) == (True, False, False)
    stripped = found("tokenizer_config.json", {"do_lower_case": False, "strip_accents": True})
    assert (stripped.lower_case, stripped.strip_accents) == (False, True)
    assert stripped.strips_accents
    same = found("tokenizer_config.json", {"do_lower_case": True, "strip_accents": True})
    assert (same.strip_accents, same.strips_accents) == (None, True)
    unset = found("tokenizer_config.json", {"do_lower_case": False, "strip_accents": None})
    assert (unset.strip_accents, unset.strips_accents) == (None, False)
    bert = found("tokenizer.json", {"normalizer": {"type": "BertNormalizer", "lowercase": True,
                                                   "strip_accents": False}})
    assert (bert.lower_case, bert.strip_accents, bert.rule) == (
        True, False, "tokenizer.json normalizer")
    lone = found("tokenizer.json", {"normalizer": {"type": "Lowercase"}})
    assert (lone.lower_case, lone.strip_accents) == (True, False)
    steps = found("tokenizer.json", {"normalizer": {"type": "Sequence", "normalizers": [
        {"type": "NFD"}, {"type": "StripAccents"}]}})
    assert (steps.lower_case, steps.strip_accents) == (False, True)
    # A forced lower_case keeps the checkpoint's accents where they were set apart.
    assert casing.decide(False, True, kept).strip_accents is None  # false, as lower_case now
    assert casing.decide(True, True, stripped).strip_accents is None
    forced = casing.decide(False, True, found("tokenizer_config.json", {
        "do_lower_case": True, "strip_accents": True}))
    assert (forced.lower_case, forced.strips_accents) == (False, False)
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
    from family_checkpoints import tiny_cased_bert

    return tiny_cased_bert(tmp_path_factory.mktemp("cased-ckpt") / "model", cased_vocab)


def _train_file(tmp_path: Path) -> str:
    path = tmp_path / "train.tsv"
    path.write_text("text\tlabel\n" + "".join(f"{t}\t{'ab'[i % 2]}\n"
                                               for i, t in enumerate(CASED_CORPUS * 6)))
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
    assert stored == {tuple(reference(t, truncation=True)["input_ids"]) for t in CASED_CORPUS}

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
    assert cfg.lower_case is None and checkpoint.run_casing(cfg).lower_case is False
    assert checkpoint.run_casing(RunConfig(base_model=str(cased_checkpoint),
                                           lower_case=True, lower_case_override=True)).lower_case


@pytest.fixture(scope="module")
def accents_kept_checkpoint(tmp_path_factory, cased_checkpoint) -> Path:
    """The cased checkpoint with a tokenizer that lower-cases and keeps accents, as some
    multilingual, German and Turkish checkpoints set it (transformers writes it)."""
    import transformers

    folder = tmp_path_factory.mktemp("accents-kept") / "model"
    shutil.copytree(cased_checkpoint, folder)
    transformers.BertTokenizer(vocab=str(folder / "vocab.txt"), do_lower_case=True,
                               strip_accents=False).save_pretrained(folder)
    return folder


def test_the_leakage_check_keeps_the_accents_a_lower_casing_checkpoint_keeps(
        tmp_path, accents_kept_checkpoint):
    """Lower-cased with accents kept, "Café" and "cafe" are different texts to the model: the
    data step's leakage check tells them apart (validate pins only lower_case), while a
    checkpoint that strips accents counts the test row as seen in training."""
    from tasks.io import storage
    from tasks.runs.runlayout import RunContext
    from tasks.steps import data

    train, test = tmp_path / "train.tsv", tmp_path / "test.tsv"
    train.write_text("text\tlabel\nCaf\u00e9 noir\tpos\nbad film\tneg\ngood film\tpos\n"
                     "awful\tneg\n")
    test.write_text("text\tlabel\ncafe NOIR\tpos\nfine\tneg\n")
    stripping = accents_kept_checkpoint.parent / "stripping-leakage"
    shutil.copytree(accents_kept_checkpoint, stripping)
    (stripping / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    (stripping / "tokenizer.json").unlink()
    found = {}
    for name, model in (("kept", accents_kept_checkpoint), ("stripped", stripping)):
        # lower_case pinned as validate pins it; the accents come from the checkpoint
        cfg = RunConfig(base_model=str(model), train_uri=str(train), eval_uri=str(test),
                        lower_case=True, artifact_root=str(tmp_path / "art"))
        manifest = storage.read_json(data.run(cfg, RunContext(cfg.artifact_root, "dag", name)))
        found[name] = manifest["leakage"]["test_rows_in_train"]
    assert found == {"kept": 0, "stripped": 1}


def _stored_ids(manifest: dict) -> set:
    import tensorflow as tf

    records = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(
        manifest["splits"]["train"]["shards"] + manifest["splits"]["eval"]["shards"])]
    return {tuple(r.features.feature["input_ids"].int64_list.value) for r in records}


def test_accents_kept_by_a_lower_casing_checkpoint_through_tokenize_serving_and_export(
        tmp_path, accents_kept_checkpoint):
    """Lower-cased with accents kept: the TFRecords, a saved encoder and the HF export give
    BertTokenizer(do_lower_case=True, strip_accents=False)'s ids; the tokenize manifest and
    the cache key record it, so the same vocabulary with accents stripped is tokenized again."""
    import tensorflow as tf
    import transformers

    from tasks.runs.runlayout import RunContext
    from tasks.steps import data, export, tokenize

    vocab = str(accents_kept_checkpoint / "vocab.txt")
    reference = transformers.BertTokenizer(vocab=vocab, do_lower_case=True,
                                           strip_accents=False, model_max_length=48)
    stripping = transformers.BertTokenizer(vocab=vocab, do_lower_case=True, model_max_length=48)
    cfg = RunConfig(base_model=str(accents_kept_checkpoint), train_uri=_train_file(tmp_path),
                    num_shards=1, artifact_root=str(tmp_path / "art"), max_seq_length=48)
    ctx = RunContext(str(tmp_path / "art"), "dag", "accents")
    data.run(cfg, ctx)
    manifest = json.loads(Path(tokenize.run(cfg, ctx)).read_text())
    assert (manifest["lower_case"], manifest["strip_accents"]) == (True, False)
    assert _stored_ids(manifest) == {tuple(reference(t, truncation=True)["input_ids"])
                                     for t in CASED_CORPUS}
    # The same vocab.txt whose tokenizer strips accents: another cache entry, other ids.
    plain = accents_kept_checkpoint.parent / "stripping"
    shutil.copytree(accents_kept_checkpoint, plain)
    (plain / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    (plain / "tokenizer.json").unlink()
    cfg_plain = cfg.model_copy(update={"base_model": str(plain)})
    ctx_plain = RunContext(str(tmp_path / "art"), "dag", "stripping")
    data.run(cfg_plain, ctx_plain)
    other = json.loads(Path(tokenize.run(cfg_plain, ctx_plain)).read_text())
    assert other["content_hash"] != manifest["content_hash"] and not other["reused"]
    assert other["strip_accents"] is None
    assert _stored_ids(other) == {tuple(stripping(t, truncation=True)["input_ids"])
                                  for t in CASED_CORPUS} != _stored_ids(manifest)

    # Serving: the SavedModel holds the encoder as the tokenize step built it.
    encoder = checkpoint.text_encoder(accents_kept_checkpoint, True, 48,
                                      manifest["strip_accents"])
    tf.saved_model.save(encoder, str(tmp_path / "encoder"))
    loaded = tf.saved_model.load(str(tmp_path / "encoder"))
    texts = CASED_CORPUS + UNSEEN
    want = reference(texts, truncation=True)["input_ids"]
    assert loaded.encode(tf.constant(texts))[0].to_list() == want
    assert want != stripping(texts, truncation=True)["input_ids"]

    model = checkpoint.load_classifier(accents_kept_checkpoint, manifest["labels"])
    exported = tmp_path / "export"
    exported.mkdir()
    export.write_hf_checkpoint(model, manifest["labels"], accents_kept_checkpoint, exported,
                               manifest["lower_case"], manifest["max_seq_length"],
                               strip_accents=manifest["strip_accents"])
    assert casing.read(exported, "bert") == casing.Casing(
        True, "tokenizer_config.json do_lower_case", True, False)
    normalizer = json.loads((exported / "tokenizer.json").read_text())["normalizer"]
    assert (normalizer["lowercase"], normalizer["strip_accents"]) == (True, False)
    served = transformers.AutoTokenizer.from_pretrained(str(exported))
    assert served(texts, truncation=True)["input_ids"] == want


def test_a_cased_checkpoint_finds_entities_end_to_end(tmp_path, cased_checkpoint):
    """Token classification on the cased checkpoint: TFRecords as BertTokenizer(do_lower_case=
    False) with is_split_into_words, train, evaluate, export; the SavedModel's entities are
    character spans of the raw text, as transformers' pipeline finds them, in capitalised
    words; the export records do_lower_case false."""
    import transformers

    reference = transformers.BertTokenizer(vocab=str(cased_checkpoint / "vocab.txt"),
                                           do_lower_case=False)
    version, metrics = token_steps_of_a_family(cased_checkpoint, tmp_path, reference)
    assert metrics["f1"] > 0.25, metrics  # an untrained model scores 0
    assert json.loads((version / "tokenizer_config.json").read_text())["do_lower_case"] is False
    assert not casing.read(version, "bert").lower_case
    # Texts without punctuation inside a word: transformers' pipeline takes BertPreTokenizer's
    # words ("fox's" is three), bertflow the whitespace words it was trained on.
    texts = ["Théo visited Paris", SERVED[1], "Zoë and Müller visited New York",
             "the Quick café saw José"]  # words of the training sentences
    capitalised = {w for text in texts for w in text.split() if w[0].isupper()}
    entities_as_the_pipeline(version, "BertForTokenClassification", texts, capitalised)
