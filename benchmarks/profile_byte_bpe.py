"""Where RoBERTa's in-graph byte-level BPE spends its time (tasks/model/byte_bpe.py), against
transformers' RobertaTokenizerFast on the same texts. Prints; writes no results file.

    ./.venv/bin/python benchmarks/profile_byte_bpe.py [--texts 2000] [--repeats 7] [--smoke]

No RoBERTa vocabulary can be downloaded here, so a byte-level BPE of RoBERTa's size (50,265
pieces asked; as many merges as the text allows) is trained with `tokenizers` on the shared
GoEmotions, BANKING77 and SST-2 training texts, and `--texts` of them are sampled (seed 0).
Both sides tokenize the same list without special tokens, after a warm-up call; the ids are
checked equal first. Stages timed alone: `pretokenize` (GPT-2's regex) and the merge loop
(`bpe`) on the sample's distinct words. Runs alternate; figures are medians in ms.
`--smoke`: 64 synthetic rows, a small vocabulary, one repeat.
"""
from __future__ import annotations

import argparse
import os
import random
import tempfile
from pathlib import Path

from lib import common

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SOURCES = ("goemotions/train.tsv", "banking77/train.tsv", "sst2/train.tsv")
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def read_texts(paths: list[Path]) -> list[str]:
    texts = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            column = f.readline().rstrip("\n").split("\t").index("text")
            texts += [line.rstrip("\n").split("\t")[column] for line in f if line.strip()]
    return texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--texts", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-bpe-")) if args.smoke else None
    if args.smoke:
        common.DATA_ROOT = common.smoke_data_root(work / "data")
        sources, vocab_size, args.repeats = ("sst2/train.tsv", "snips/train.tsv"), 300, 1
    else:
        sources, vocab_size = SOURCES, 50265
    texts = read_texts(common.require_data(*sources))
    work = work or Path(tempfile.mkdtemp(prefix="bench-bpe-"))

    import tensorflow as tf
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    from tasks.model import byte_bpe

    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2,
                                special_tokens=SPECIALS, show_progress=False)
    trainer.save_model(str(work))
    hf = transformers.RobertaTokenizerFast.from_pretrained(str(work))
    ours = byte_bpe.ByteBpeTokenizer(work / "vocab.json", work / "merges.txt")
    sample = random.Random(0).sample(texts, min(args.texts, len(texts)))
    batch = tf.constant(sample)
    if ours.tokenize(batch).to_list() != hf(sample, add_special_tokens=False)["input_ids"]:
        raise SystemExit("profile_byte_bpe: ids differ from RobertaTokenizerFast's")
    pretokenize = tf.function(byte_bpe.pretokenize,
                              input_signature=[tf.TensorSpec([None], tf.string)])
    merge = tf.function(ours.bpe, input_signature=[tf.TensorSpec([None], tf.string)])
    distinct, _ = tf.unique(pretokenize(batch).flat_values)
    merge(distinct)  # traced once, outside the timing, as the other sides were above

    def ms(fn):
        return lambda: common.timed(fn)[0] * 1000

    times = common.alternate({
        "hf_fast": ms(lambda: hf(sample, add_special_tokens=False)),
        "tokenize": ms(lambda: ours.tokenize(batch)),
        "pretokenize": ms(lambda: pretokenize(batch)),
        "bpe_distinct_words": ms(lambda: merge(distinct))}, args.repeats)
    medians = {k: common.median(v) for k, v in times.items()}
    merges = sum(1 for line in open(work / "merges.txt", encoding="utf-8")) - 1
    print(f"{len(sample)} texts, {int(tf.size(distinct))} distinct words, {merges} merges"
          + (" (smoke)" if args.smoke else ""))
    for name, value in medians.items():
        print(f"  {name:>20}: {value:8.1f} ms  ({value / medians['hf_fast']:.2f}x hf_fast)")


if __name__ == "__main__":
    main()
