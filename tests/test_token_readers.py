"""tasks/io/token_readers.py: CoNLL and JSON Lines sentences, their errors, the tag
vocabulary; the sentence split (tasks/steps/token_data.py); on hand-made files and on WNUT17
(skipped without /work/shared/data)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.errors import DataError
from tasks.io.token_readers import conll_sentences, jsonl_sentences, tag_vocabulary
from tasks.steps.token_data import split_sentences

WNUT17 = Path(__file__).resolve().parents[2] / "shared" / "data" / "wnut17"


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_conll_tabs_spaces_docstart_and_blank_lines(tmp_path):
    uri = write(tmp_path, "a.conll", "-DOCSTART- -X- O O\n\n"
                                     "EU NNP B-ORG\nrejects VBZ O\n \t\n"
                                     "Peter\tB-PER\nBlack\tI-PER\n\n\n"
                                     "-DOCSTART-\tO\nOnly\tO")
    assert list(conll_sentences(uri)) == [
        (3, ["EU", "rejects"], ["B-ORG", "O"]),
        (6, ["Peter", "Black"], ["B-PER", "I-PER"]),
        (11, ["Only"], ["O"])]


def test_conll_tag_column(tmp_path):
    uri = write(tmp_path, "a.conll", "EU B-ORG NNP\nsays O VBZ\n")
    assert list(conll_sentences(uri, tag_column=1)) == [(1, ["EU", "says"], ["B-ORG", "O"])]


def test_i_after_o_is_kept_as_written(tmp_path):
    uri = write(tmp_path, "a.conll", "in O\nNew I-LOC\nYork I-LOC\n")
    assert list(conll_sentences(uri))[0][2] == ["O", "I-LOC", "I-LOC"]


@pytest.mark.parametrize("text, line, reason", [
    ("EU B-ORG\nrejects\n", 2, "expected a token and its tag"),
    ("EU B-ORG\n\nsays E-ORG\n", 3, "tag 'E-ORG' is not in the BIO scheme"),
    ("EU B-\n", 1, "tag 'B-' is not in the BIO scheme"),
    ("EU ORG\n", 1, "tag 'ORG' is not in the BIO scheme"),
    ("-DOCSTART- -X- O O\n\n", 1, "no sentences"),
])
def test_conll_errors_name_file_and_line(tmp_path, text, line, reason):
    uri = write(tmp_path, "bad.conll", text)
    with pytest.raises(DataError) as err:
        list(conll_sentences(uri))
    assert err.value.line == line and err.value.path == uri
    assert reason in str(err.value)


def test_conll_empty_file(tmp_path):
    uri = write(tmp_path, "empty.conll", " \n\t\n")
    with pytest.raises(DataError, match="file is empty"):
        list(conll_sentences(uri))


def test_jsonl_sentences_and_columns(tmp_path):
    rows = [{"words": ["EU", "rejects"], "ner": ["B-ORG", "O"]}, {},
            {"words": ["Peter"], "ner": ["B-PER"]}]
    uri = write(tmp_path, "a.jsonl", "\n".join(json.dumps(r) if r else "" for r in rows))
    assert list(jsonl_sentences(uri, "words", "ner")) == [
        (1, ["EU", "rejects"], ["B-ORG", "O"]), (3, ["Peter"], ["B-PER"])]


@pytest.mark.parametrize("row, reason", [
    ({"tokens": ["a", "b"], "tags": ["O"]}, "2 tokens but 1 tags"),
    ({"tokens": ["a"], "tags": [3]}, "field 'tags' must be a non-empty list"),
    ({"tokens": ["a"], "tags": ["X-PER"]}, "not in the BIO scheme"),
    ({"tokens": ["a"]}, "field 'tags' must be"),
])
def test_jsonl_errors(tmp_path, row, reason):
    good = {"tokens": ["a"], "tags": ["O"]}
    uri = write(tmp_path, "bad.jsonl", json.dumps(good) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError) as err:
        list(jsonl_sentences(uri))
    assert err.value.line == 2 and reason in str(err.value)


def test_tag_vocabulary_o_first_then_sorted_b_and_i_of_every_type():
    assert tag_vocabulary(["O", "I-PER", "B-LOC", "B-PER", "O"]) == [
        "O", "B-LOC", "B-PER", "I-LOC", "I-PER"]


def test_split_is_seeded_exact_and_keeps_order():
    sentences = [(i, [f"w{i}"], ["O"]) for i in range(50)]
    train, evals = split_sentences(sentences, 0.1, seed=7)
    assert len(evals) == 5 and len(train) == 45
    assert sorted(train + evals) == sentences
    assert [s[0] for s in evals] == sorted(s[0] for s in evals)
    assert split_sentences(sentences, 0.1, seed=7) == (train, evals)
    assert split_sentences(sentences, 0.1, seed=8)[1] != evals


@pytest.mark.skipif(not WNUT17.is_dir(), reason=f"{WNUT17} absent (shared test data)")
def test_wnut17_reads_whole():
    """Counts from the data's README (3,394 / 1,009 sentences) and its 13 tags."""
    train = list(conll_sentences(str(WNUT17 / "train.conll"), block_size=64 << 10))
    dev = list(conll_sentences(str(WNUT17 / "dev.conll")))
    assert (len(train), len(dev)) == (3394, 1009)
    assert train[0][:2] == (1, train[0][1]) and train[0][1][0] == "@paulwalk"
    labels = tag_vocabulary(tag for _, _, tags in train for tag in tags)
    assert len(labels) == 13 and labels[:3] == ["O", "B-corporation", "B-creative-work"]


def test_a_lone_byte_order_mark_line_separates_sentences(tmp_path):
    uri = write(tmp_path, "a.conll", "a\tO\n\ufeff\nb\tB-X\n\ufeff\n")
    assert list(conll_sentences(uri)) == [(1, ["a"], ["O"]), (3, ["b"], ["B-X"])]
