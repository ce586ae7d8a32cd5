"""Peer side of benchmarks/batch_score_throughput.py: transformers' `pipeline`
("text-classification", PyTorch, CPU) on the version folder bertflow exported (it is a Hugging
Face checkpoint), batch size set, truncation on. Runs in .venv-peer (torch, no TensorFlow).

Reads one text per line of --texts (JSON strings), prints one line `RESULT {json}`: the rows,
the seconds to build the pipeline (load), to the first row scored and for all rows.
"""
import argparse
import json
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--texts", required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--batch-size", type=int, required=True)
    ap.add_argument("--max-length", type=int, required=True)
    args = ap.parse_args()
    with open(args.texts, encoding="utf-8") as f:
        texts = [json.loads(line) for line in f]
    t0 = time.perf_counter()
    import torch
    from transformers import pipeline

    torch.set_num_threads(torch.get_num_threads())
    classify = pipeline("text-classification", model=args.model_dir,
                        tokenizer=args.model_dir, device=-1)
    loaded = time.perf_counter()
    first = None
    out = []
    for start in range(0, len(texts), args.batch_size):
        chunk = texts[start:start + args.batch_size]
        out += classify(chunk, batch_size=args.batch_size, truncation=True,
                        max_length=args.max_length, top_k=None)
        if first is None:
            first = time.perf_counter()
    done = time.perf_counter()
    assert len(out) == len(texts)
    print("RESULT " + json.dumps({
        "rows": len(texts), "load_s": loaded - t0, "first_row_s": first - t0,
        "score_s": done - loaded, "rows_per_s": len(texts) / (done - loaded),
        "torch_threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
