"""The in-graph byte-level BPE (tasks/model/byte_bpe.py) against Hugging Face's fast tokenizer.

A tiny byte-level BPE is trained here with `tokenizers` (no download) and written as vocab.json
+ merges.txt; transformers' RobertaTokenizerFast built from the same files is the reference.
"""
from __future__ import annotations

import json
import unicodedata

import numpy as np
import pytest
import tensorflow as tf

from tasks import fresh_load
from tasks.model import byte_bpe

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

TRAINING = [
    "The quick brown fox jumps over the lazy dog. It's the dog's day, isn't it?",
    "They're sure we've seen what I'm saying; you'll know what he'd do.",
    "Numbers like 12,345.67 and 2024-01-31 appear in reports; prices rose 3.5%!!",
    "Prices in Paris, Zürich and São Paulo: café, naïve, résumé, Ångström.",
    "東京と大阪で会議があります。中文文本也在这里。",
    "Emoji: 😀🎉👍 and more text... --- ??? !!! ((nested)) [brackets] {braces}",
    "Tabs\tand\nnewlines\r\nmix  with   multiple    spaces.",
] * 20

CORPUS = [
    "Hello world",
    "The Quick Brown FOX, it's THE dog's",
    "I'm sure they're here; we've got what you'll need, he'd say. Isn't it?",
    "x 's  'sa 't 're 've 'm 'll 'd",  # contractions after spaces and alone
    "Café naïve RÉSUMÉ Zürich São Ångström e\u0301 n\u0303",
    "東京と大阪 中文 한국어 テキスト",
    "😀 🎉🎉 👍🏽 ❤️ 🇫🇷",
    "123 4567 12,345.67 3.14159 2024-01-31 ١٢٣",
    "!!! ??? ... --- ((( ))) :-) <b>tag</b> a@b.c https://x.org/a?b=c",
    "multiple  spaces   here    and\ttabs\t\tand\nnewlines\n\n\r\nend  ",
    "   leading spaces",
    "\t\tleading tabs",
    "trailing tab\t",
    "nbsp\u00a0here\u3000ideographic\u2009thin space",
    "zero\u200bwidth\u200djoiner\ufeffbom",
    "",
    " ",
    "a",
]
# Never in the training text: each becomes byte pieces of GPT-2's alphabet.
UNSEEN = ["Ωμέγα ψ", "🦄🦖", "\u0000nul\u0001ctl", "ẞ ǅ ﬁ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "Ꭰꭰ ⰀⰁ"]


def train_byte_bpe(folder, extra: tuple[str, ...] = (), vocab_size: int = 600) -> tuple:
    """A tiny byte-level BPE on TRAINING (and `extra` texts), RoBERTa's specials first:
    (vocab.json, merges.txt) in `folder`."""
    from tokenizers import ByteLevelBPETokenizer

    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(TRAINING + list(extra), vocab_size=vocab_size, min_frequency=2,
                                special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    trainer.save_model(str(folder))
    return folder / "vocab.json", folder / "merges.txt"


@pytest.fixture(scope="module")
def bpe_files(tmp_path_factory):
    return train_byte_bpe(tmp_path_factory.mktemp("byte_bpe"))


@pytest.fixture(scope="module")
def hf(bpe_files):
    # From the folder, as a checkpoint's tokenizer loads (transformers 5 takes no file
    # arguments in the constructor).
    tokenizer = transformers.RobertaTokenizerFast.from_pretrained(str(bpe_files[0].parent))
    assert tokenizer.vocab_size == len(byte_bpe.read_vocab(bpe_files[0]))
    return tokenizer


@pytest.fixture(scope="module")
def encoder(bpe_files):
    return byte_bpe.RobertaTextEncoder(*bpe_files, max_seq_length=512)


def test_the_tiny_vocabulary_merges_real_words(bpe_files):
    """Guards the parity tests from passing on a vocabulary of single bytes."""
    merges = byte_bpe.read_merges(bpe_files[1])
    assert len(merges) > 200
    assert "Ġthe" in byte_bpe.read_vocab(bpe_files[0])


def test_pretokenize_matches_tokenizers_on_assigned_code_points():
    """GPT-2's regex rebuilt for RE2 (no lookahead) splits like `tokenizers` (Oniguruma),
    each code point in letter, digit, space-run and contraction contexts. Code points
    unassigned in Python's Unicode tables are left out: Oniguruma's tables are newer than RE2's,
    so scripts added since may be classed differently (docs/model.md says so)."""
    from tokenizers import pre_tokenizers

    reference = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    points = [c for c in range(0x110000)
              if (c < 0x800 or c % 31 == 0) and unicodedata.category(chr(c)) not in ("Cn", "Cs")]
    # With a double space before a non-space (GPT-2's lookahead fires) and without (one regex
    # split suffices), so that each of pretokenize's paths (ASCII or not) meets every point.
    texts = [f"a{chr(c)}b {chr(c)}{chr(c)}1 '{chr(c)}x{gap}{chr(c)}"
             for c in points for gap in ("  ", " ")]
    texts += CORPUS + UNSEEN
    chars = byte_bpe.bytes_to_unicode()
    got = byte_bpe.pretokenize(tf.constant(texts)).to_list()
    mismatched = []
    for text, words in zip(texts, got):
        want = [w for w, _ in reference.pre_tokenize_str(text)]
        if want != ["".join(chars[b] for b in w) for w in words]:
            mismatched.append(text)
    assert not mismatched, mismatched[:5]


def test_ids_equal_roberta_tokenizer_fast(encoder, hf):
    texts = CORPUS + UNSEEN
    ids, types, _ = encoder.encode_with_lengths(tf.constant(texts))  # the traced path: below
    want = hf(texts)["input_ids"]
    assert ids.to_list() == want
    assert not np.any(types.flat_values.numpy())
    # The unseen characters come out as byte pieces, not as <unk> (GPT-2's byte alphabet).
    unseen = encoder.wordpieces(tf.constant(UNSEEN)).flat_values.numpy()
    assert encoder.unk_id not in unseen and len(unseen) >= sum(len(t) for t in UNSEEN)


def test_pairs_and_truncation_equal_roberta_tokenizer_fast(encoder, hf, bpe_files):
    firsts = CORPUS[:9] + ["short", ""]
    seconds = list(reversed(CORPUS[:9])) + ["a much longer second text " * 4, "x"]
    ids, _, _ = encoder.encode_with_lengths(tf.constant(firsts), tf.constant(seconds))
    assert ids.to_list() == hf(firsts, seconds)["input_ids"]
    assert ids.to_list()[0][:1] == [hf.bos_token_id]
    for max_len in (6, 9, 12, 17):
        short = byte_bpe.RobertaTextEncoder(*bpe_files, max_seq_length=max_len,
                                            tokenizer=encoder.tokenizer)
        want_single = hf(CORPUS, truncation=True, max_length=max_len)["input_ids"]
        want_pair = hf(firsts, seconds, truncation="longest_first",
                       max_length=max_len)["input_ids"]
        assert short.encode_with_lengths(tf.constant(CORPUS))[0].to_list() == want_single
        pair_ids, _, _ = short.encode_with_lengths(tf.constant(firsts), tf.constant(seconds))
        assert pair_ids.to_list() == want_pair
        # The tokenize step's numpy assembly gives the same rows.
        flat, lengths, types, untruncated = short.encode_numpy(firsts, seconds)
        rows = np.split(flat, np.cumsum(lengths)[:-1])
        assert [r.tolist() for r in rows] == want_pair
        assert not types.any()
        full = hf(firsts, seconds)["input_ids"]
        assert untruncated.tolist() == [len(r) for r in full]


def test_saved_model_serves_in_a_fresh_interpreter(encoder, hf, tmp_path):
    """No custom op: the SavedModel loads with only tensorflow and tensorflow_text."""

    class Serving(tf.Module):
        def __init__(self):
            super().__init__()
            self.encoder = encoder

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string),
                                      tf.TensorSpec([None], tf.string)])
        def serve(self, text, text_pair):
            ids, _ = self.encoder(text, text_pair)
            return {"input_ids": ids.to_tensor(default_value=self.encoder.pad_id)}

    module = Serving()
    path = str(tmp_path / "saved")
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    texts, pairs = CORPUS[:6] + UNSEEN[:2], CORPUS[6:14]
    served = fresh_load.predict(path, {"text": texts, "text_pair": pairs})
    want = hf(texts, pairs, padding=True)["input_ids"]
    assert np.asarray(served["input_ids"], np.int64).tolist() == want


def test_bad_files_are_named(tmp_path):
    vocab = tmp_path / "vocab.json"
    merges = tmp_path / "merges.txt"
    vocab.write_text(json.dumps({"a": 0, "b": 1}))
    merges.write_text("#version: 0.2\na b\nab\n")
    with pytest.raises(ValueError, match=r"merges.txt line 3: 'ab'"):
        byte_bpe.read_merges(merges)
    merges.write_text("a b\n")
    with pytest.raises(ValueError, match=r"vocab.json: no <s>, </s>, <pad>, <unk>"):
        byte_bpe.RobertaTextEncoder(vocab, merges)
    vocab.write_text(json.dumps({t: i for i, t in enumerate(["<s>", "</s>", "<pad>", "<unk>",
                                                              "a", "b"])}))
    with pytest.raises(ValueError, match=r"merges.txt: the merge 'a b' needs 'ab', which is "
                                         r"not in .*vocab.json"):
        byte_bpe.RobertaTextEncoder(vocab, merges)
    vocab.write_text("[1, 2]")
    with pytest.raises(ValueError, match="vocab.json: expected a JSON object"):
        byte_bpe.read_vocab(vocab)


def test_words_align_as_roberta_tokenizer_fast_splits_them(encoder, bpe_files):
    """Token classification: each word tokenized as after a space, its first piece (the one
    with Ġ) labelled, as RobertaTokenizerFast(add_prefix_space=True) with
    is_split_into_words=True gives the pieces and word_ids."""
    from tasks.model.token_encoding import WordPieceAligner

    hf = transformers.RobertaTokenizerFast.from_pretrained(str(bpe_files[0].parent),
                                                           add_prefix_space=True)
    sentences = [text.split() for text in CORPUS + UNSEEN if text.split()]
    aligner = WordPieceAligner(encoder)  # kept: its tf.function holds it weakly
    out = aligner.encode_words(tf.ragged.constant(sentences))
    ids, starts = out["input_ids"].to_list(), out["word_starts"].to_list()
    for sentence, row, row_starts in zip(sentences, ids, starts):
        want = hf(sentence, is_split_into_words=True)
        assert row == want["input_ids"]
        word_ids = want.word_ids()
        assert row_starts == [word_ids.index(i) for i in range(len(sentence))]
