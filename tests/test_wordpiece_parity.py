"""bertflow's in-graph WordPiece (BertTextEncoder: tasks/model/wordpiece_normalizer.py, then
tensorflow-text's FastBertTokenizer) gives transformers' BertTokenizerFast's ids, with and
without lower_case, and with accents set apart from it (lower-cased keeping accents, cased
stripping them: tasks/model/casing.py), on:

- texts built to hit each class where tensorflow-text's own normaliser differed (case folding
  of ß, ligatures and titlecase letters, control and format characters, U+FFFD and NUL,
  accents, CJK, ASCII symbols as punctuation, Unicode whitespace, words over 100 characters);
- seeded random mixes of those characters;
- "a<c>b <c>" (inside a word, and alone) for every code point of the BMP and a seeded sample
  of the other planes, unassigned and private-use ones included (surrogates cannot be UTF-8).

The differences left are listed in wordpiece_known_differences.txt (Unicode table versions,
and Hugging Face's CJK range); the test asserts that list exactly on the BMP and that nothing
outside it differs (with accents set apart, that nothing outside the whole list differs: the
list's modes are of lower_case alone). The vocabulary is written here (every character of
the corpus in each normal form, whole and as a ##suffix): nothing is downloaded.
"""
from __future__ import annotations

import random
import unicodedata
from pathlib import Path

import pytest
import tensorflow as tf

from tasks.model.text_encoder import BertTextEncoder

CLASSES = {
    "case folding": ["Straße STRASSE ß ẞ", "ﬁne ﬂow ﬀ ﬃ ﬅ", "Ǆ ǅ ǆ Ǳ ǲ ǅungla", "İstanbul ıi I",
                     "ΟΔΟΣ Σ σς ΣΑΣ. ὈΔΥΣΣΕΎΣ", "ŉ ſ µ ª ² ½ Ⅻ ℃ ㎏ Ａｂｃ 𝐀𝐚 ᾈ"],
    "control characters": ["a\x00b\x01c\x7fd\x85e\x9ff", "tab\there\nnew\rret\x0bvt\x0cff\x1cfs"],
    "U+FFFD and NUL": ["x\ufffdy \ufffd", "\x00lead trail\x00", "\x00", "\ufffd\ufffd"],
    "format characters": ["zero\u200bwidth soft\u00adhyphen bom\ufeffx", "👨‍👩‍👧 ❤️ 🇫🇷"],
    "accents": ["café cafe\u0301 CAFÉ Ångström", "a" + "\u0301" * 5, "Ñandú ÜBER über",
                "Tiếng Việt", "\u0301lead"],
    "chinese": ["中文字符abc日本語", "㐀𠀀丽x", "한국어 텍스트 カタカナ"],
    "punctuation": ["$5 ^up `tick` ~a| <b> @x #y", "«q» ¿qué? ¡sí! — – … a.b,c;d:e'f\"g"],
    "whitespace": ["\u2028line\u2029para\u00a0nbsp\u3000ideo", "  many   spaces  "],
    "long words": ["ส" * 40, "é" * 60, "a" * 100, "a" * 101, "б" * 99 + " " + "b" * 101,
                   "ก" * 150, "x" * 500, "É" * 100 + "\u0301",
                   "word, 中文\tand\nmore… ÉTÉ " * 8 + "ส" * 101 + "!"],
    "private use": ["\ue000private\U000f0000use", "a\U0010fffdb"],
}
# CJK ideographs Hugging Face does not split off (its range starts at U+2B920).
CJK_GAP = "\U0002b820\U0002b821x"
SAMPLED_ABOVE_BMP = 3000
KNOWN_FILE = Path(__file__).with_name("wordpiece_known_differences.txt")


def known_differences() -> dict[str, set[int]]:
    """{"lower": code points, "cased": code points} from the known-differences file."""
    known = {"lower": set(), "cased": set()}
    for line in KNOWN_FILE.read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#"):
            continue
        span, mode = line.split()[:2]
        first, _, last = span.partition("..")
        points = range(int(first, 16), int(last or first, 16) + 1)
        for key in ("lower", "cased") if mode == "both" else (mode,):
            known[key].update(points)
    return known


def code_points() -> list[int]:
    rng = random.Random(45)
    above = [c for c in rng.sample(range(0x10000, 0x110000), SAMPLED_ABOVE_BMP)]
    return [c for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF] + above


def mixes() -> list[str]:
    """Seeded random strings over the classes' characters, spaces and ASCII letters."""
    pool = sorted(set("".join(t for texts in CLASSES.values() for t in texts)) | set("ab  "))
    rng = random.Random(7)
    return ["".join(rng.choice(pool) for _ in range(rng.randint(1, 16))) for _ in range(400)]


@pytest.fixture(scope="module")
def corpus():
    return {"classes": [t for texts in CLASSES.values() for t in texts] + mixes(),
            "points": [f"a{chr(c)}b {chr(c)}" for c in code_points()]}


@pytest.fixture(scope="module")
def vocab_file(corpus, tmp_path_factory) -> Path:
    chars = set()
    for text in corpus["classes"] + corpus["points"] + [CJK_GAP]:
        for c in set(text):
            for form in (c, c.lower(), unicodedata.normalize("NFD", c),
                         unicodedata.normalize("NFD", c).lower()):
                chars.update(form)
    # Separators and controls cannot be vocabulary lines; neither tokenizer emits them.
    chars = sorted(c for c in chars if unicodedata.category(c)[0] not in "CZ")
    words = ["straße", "strasse", "ss", "##ss", "fi", "##ne", "café", "cafe", "über", "##über"]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + chars + ["##" + c for c in chars]
    path = tmp_path_factory.mktemp("wordpiece") / "vocab.txt"
    path.write_text("\n".join(vocab + words) + "\n", encoding="utf-8")
    return path


def ids_of(encoder, texts) -> list[list[int]]:
    out = []
    for start in range(0, len(texts), 8192):
        out += encoder.encode(tf.constant(texts[start:start + 8192]))[0].to_list()
    return out


@pytest.mark.parametrize("lower_case,strip_accents",
                         [(False, None), (True, None), (True, False), (False, True)],
                         ids=["cased", "lower_case", "lower_case_keep_accents",
                              "cased_strip_accents"])
def test_ids_equal_bert_tokenizer_fast_but_the_listed_code_points(lower_case, strip_accents,
                                                                  corpus, vocab_file):
    import transformers

    hf = transformers.BertTokenizerFast(vocab=str(vocab_file), do_lower_case=lower_case,
                                        strip_accents=strip_accents)
    encoder = BertTextEncoder(vocab_file, lower_case=lower_case, max_seq_length=512,
                              strip_accents=strip_accents)
    listed = known_differences()
    known = listed["lower" if lower_case else "cased"]
    if strip_accents is not None:  # accents apart: the listed points of either mode
        known = listed["lower"] | listed["cased"]

    texts = corpus["classes"]
    assert not {ord(c) for t in texts for c in t} & known  # so all must match exactly
    got, want = ids_of(encoder, texts), hf(texts)["input_ids"]
    wrong = [(t, hf.convert_ids_to_tokens(g), hf.convert_ids_to_tokens(w))
             for t, g, w in zip(texts, got, want) if g != w]
    assert not wrong, wrong[:5]
    if strip_accents is not None:  # the classes' accents make the setting matter
        default = transformers.BertTokenizerFast(vocab=str(vocab_file), do_lower_case=lower_case)
        assert want != default(texts)["input_ids"]

    points = code_points()
    got, want = ids_of(encoder, corpus["points"]), hf(corpus["points"])["input_ids"]
    differ = {c for c, g, w in zip(points, got, want) if g != w}
    assert differ - known == set(), sorted(f"{c:04X}" for c in differ - known)[:40]
    if strip_accents is None:
        bmp_known = {c for c in known if c < 0x10000}
        assert {c for c in differ if c < 0x10000} == bmp_known, "update the known list"

    # The known CJK difference, spelled out: Hugging Face keeps these in one word.
    (ours,), (theirs,) = ids_of(encoder, [CJK_GAP]), hf([CJK_GAP])["input_ids"]
    assert hf.convert_ids_to_tokens(ours)[1:-1] == ["\U0002b820", "\U0002b821", "x"]
    assert hf.convert_ids_to_tokens(theirs)[1:-1] == ["\U0002b820", "##\U0002b821", "##x"]

