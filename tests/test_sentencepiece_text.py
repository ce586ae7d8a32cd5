"""The in-graph SentencePiece encoder (tasks/model/sentencepiece_text.py) against Hugging Face's
fast XLM-R tokenizer.

A tiny unigram model (XLM-R's kind) is trained here with the sentencepiece package (a test
dependency, requirements.in; nothing downloads) under XLM-R's file name, with its default
nmt_nfkc normalizer; transformers' XLMRobertaTokenizer loaded from that folder (its
XLMRobertaConverter: fairseq's ids) is the reference. That a SavedModel holding the encoder
serves in a fresh interpreter with only tensorflow and tensorflow_text is checked by the export
step in tests/test_xlm_roberta_steps.py.
"""
from __future__ import annotations

import io
import json
import unicodedata

import numpy as np
import pytest
import tensorflow as tf

from tasks.model import sentencepiece_text
from tasks.model.sentencepiece_model import FAIRSEQ, read_model
from test_byte_bpe import CORPUS, TRAINING

spm = pytest.importorskip("sentencepiece")
transformers = pytest.importorskip("transformers")

MODEL_FILE = "sentencepiece.bpe.model"
MULTILINGUAL = [
    "Der schnelle braune Fuchs springt über den faulen Hund. Straße, Größe, Äpfel.",
    "Le café est très chaud ; où est la gare ? Ça va, merci à vous.",
    "El niño comió piña en la mañana; ¿dónde está? ¡Olé!",
    "Быстрая коричневая лиса прыгает через ленивую собаку.",
    "الثعلب البني السريع يقفز فوق الكلب الكسول",
    "मैं हिंदी में लिख रहा हूँ और यह एक परीक्षण है।",
    "我爱自然语言处理。東京は日本の首都です。서울은 한국의 수도입니다.",
]
# Never in the training text: characters the model has no piece for become <unk>.
UNSEEN = ["Ωμέγα ψ", "🦄🦖", "\u0000nul\u0001ctl", "ẞ ǅ ﬁ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "Ꭰꭰ ⰀⰁ",
          "a\u0085b\u1680c\u2028d", "``quoted'' ＡＢＣ① ㍿"]


def train_sentencepiece(folder):
    """A tiny unigram SentencePiece model with XLM-R's first pieces (<unk> <s> </s>), written
    as `folder`/sentencepiece.bpe.model."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TRAINING + MULTILINGUAL * 20), model_writer=model,
        model_type="unigram", vocab_size=500, hard_vocab_limit=False, character_coverage=1.0,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1, minloglevel=2)
    (folder / MODEL_FILE).write_bytes(model.getvalue())
    return folder / MODEL_FILE


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    return train_sentencepiece(tmp_path_factory.mktemp("spm"))


@pytest.fixture(scope="module")
def hf(model_file):
    tokenizer = transformers.XLMRobertaTokenizer.from_pretrained(str(model_file.parent))
    assert tokenizer.backend_tokenizer.model.__class__.__name__ == "Unigram"
    return tokenizer


@pytest.fixture(scope="module")
def encoder(model_file):
    return sentencepiece_text.XlmRobertaTextEncoder(model_file, max_seq_length=512)


def test_the_tiny_model_has_real_pieces_and_fairseq_ids(encoder, hf, model_file):
    """Guards the parity tests from passing on a model of single characters."""
    _, model = read_model(model_file)
    assert sum(len(p) > 1 for p in model.pieces) > 60
    assert encoder.vocab_size == hf.vocab_size == len(model.pieces) + 2
    assert (encoder.cls_id, encoder.pad_id, encoder.sep_id, encoder.unk_id) == (0, 1, 2, 3)
    assert hf.convert_tokens_to_ids(["<s>", "<pad>", "</s>", "<unk>"]) == [0, 1, 2, 3]
    assert hf.mask_token_id == encoder.vocab_size - 1 == FAIRSEQ.vocab_size(model) - 1


def test_ids_equal_the_fast_tokenizer_on_every_code_point(encoder, hf):
    """Each code point below U+0800, every 31st above and every whitespace character,
    between letters, after a space and doubled (Hugging Face splits on Rust's whitespace after
    the model's normalizer)."""
    points = [c for c in range(1, 0x110000)
              if (c < 0x800 or c % 31 == 0 or chr(c) in sentencepiece_text.RUST_WHITESPACE)
              and unicodedata.category(chr(c)) != "Cs"]
    texts = [f"a{chr(c)}b {chr(c)}{chr(c)}1 x{chr(c)}" for c in points]
    got = encoder.wordpieces(tf.constant(texts)).to_list()
    want = hf(texts, add_special_tokens=False)["input_ids"]
    mismatched = [(t, g, w) for t, g, w in zip(texts, got, want) if g != w]
    assert not mismatched, mismatched[:5]


def test_ids_equal_the_fast_tokenizer(encoder, hf):
    texts = CORPUS + MULTILINGUAL + UNSEEN
    ids, types, _ = encoder.encode_with_lengths(tf.constant(texts))
    assert ids.to_list() == hf(texts)["input_ids"]
    assert not np.any(types.flat_values.numpy())
    unseen = encoder.wordpieces(tf.constant(UNSEEN)).flat_values.numpy()
    assert encoder.unk_id in unseen  # the model's unknown piece, at fairseq's id


def test_pairs_and_truncation_equal_the_fast_tokenizer(encoder, hf, model_file):
    firsts = CORPUS[:9] + MULTILINGUAL[:3] + ["short", ""]
    seconds = list(reversed(CORPUS[:9])) + MULTILINGUAL[3:6] + ["a much longer text " * 4, "x"]
    ids, _, _ = encoder.encode_with_lengths(tf.constant(firsts), tf.constant(seconds))
    assert ids.to_list() == hf(firsts, seconds)["input_ids"]
    for max_len in (6, 9, 17):
        short = sentencepiece_text.XlmRobertaTextEncoder(model_file, max_seq_length=max_len)
        texts = CORPUS + MULTILINGUAL
        want_single = hf(texts, truncation=True, max_length=max_len)["input_ids"]
        assert short.encode_with_lengths(tf.constant(texts))[0].to_list() == want_single
        want_pair = hf(firsts, seconds, truncation="longest_first",
                       max_length=max_len)["input_ids"]
        pair_ids, _, _ = short.encode_with_lengths(tf.constant(firsts), tf.constant(seconds))
        assert pair_ids.to_list() == want_pair
        flat, lengths, types, untruncated = short.encode_numpy(firsts, seconds)
        assert [r.tolist() for r in np.split(flat, np.cumsum(lengths)[:-1])] == want_pair
        assert not types.any()
        assert untruncated.tolist() == [len(r) for r in hf(firsts, seconds)["input_ids"]]


def test_pre_split_words_equal_is_split_into_words(encoder, hf):
    from tasks.model.token_encoding import WordPieceAligner

    sentences = [["Zürich", "ist", "schön"], ["東京", "は", "首都"], ["Ωμέγα", "x"]]
    aligner = WordPieceAligner(encoder)
    out = aligner.encode_words(tf.ragged.constant(sentences))
    want = hf(sentences, is_split_into_words=True)
    assert out["input_ids"].to_list() == want["input_ids"]
    starts = [[ids.index(w) for w in range(len(s))]
              for s, ids in ((s, want.word_ids(i)) for i, s in enumerate(sentences))]
    assert out["word_starts"].to_list() == starts


def test_bad_model_files_are_named(tmp_path, model_file):
    bad = tmp_path / MODEL_FILE
    bad.write_bytes(b"not a model at all")
    with pytest.raises(ValueError, match=r"sentencepiece.bpe.model: not a SentencePiece model"):
        sentencepiece_text.XlmRobertaTextEncoder(bad)
    other = io.BytesIO()  # a model without XLM-R's <s> and </s> at 1 and 2
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TRAINING), model_writer=other, vocab_size=150,
        hard_vocab_limit=False, unk_id=0, bos_id=-1, eos_id=-1, num_threads=1, minloglevel=2)
    bad.write_bytes(other.getvalue())
    with pytest.raises(ValueError, match=r"an XLM-R sentencepiece.bpe.model has <unk> <s> "):
        sentencepiece_text.XlmRobertaTextEncoder(bad)


def test_the_export_s_tokenizer_builds_in_a_fresh_interpreter(model_file, tmp_path):
    """What the export step writes, built first thing in a new process: `from transformers
    import convert_slow_tokenizer` gives a function there, not the module (the fresh-clone run
    failed on it when no earlier import had loaded the module)."""
    import subprocess
    import sys

    from tasks.config import PROJECT_ROOT

    script = ("import sys; from pathlib import Path\n"
              "from tasks.steps.export import sentencepiece_tokenizer\n"
              "tok = sentencepiece_tokenizer('xlm-roberta', Path(sys.argv[1]), 32)\n"
              "tok.save_pretrained(sys.argv[2]); print(tok('Hello world')['input_ids'])\n")
    done = subprocess.run([sys.executable, "-c", script, str(model_file), str(tmp_path)],
                          capture_output=True, text=True, cwd=PROJECT_ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "tokenizer.json").is_file()
    ids = json.loads(done.stdout.strip().splitlines()[-1])
    assert ids[0] == 0 and ids[-1] == 2 and len(ids) > 2  # <s> ... </s>
