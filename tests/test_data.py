"""tasks.steps.data: reading, validation errors (file/line/field), label vocabulary, split; inputs
made of several files (prefix, glob) on local disk and on the GCS and S3 emulators."""
import hashlib
import json
from collections import Counter

import pytest

from storage_servers import connections, gcs_emulator, root, s3_server  # noqa: F401
from tasks.steps import data, prepared
from tasks.io import storage
from tasks.config import DEMO_DIR, parse_config
from tasks.errors import DataError
from tasks.runs.runlayout import RunContext


def _write(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return str(path)


def _cfg(tmp_path, train, eval_uri=None, **overrides):
    return parse_config({"train_uri": train, "eval_uri": eval_uri or "",
                         "artifact_root": str(tmp_path / "artifacts"), **overrides})


def _ctx(tmp_path):
    return RunContext(str(tmp_path / "artifacts"), "dag", "run1")


def _tsv(rows, header="text\tlabel"):
    return header + "\n" + "".join(f"{t}\t{y}\n" for t, y in rows)


GOOD = [("good film", "pos"), ("bad film", "neg"), ("great acting", "pos"),
        ("dull plot", "neg")]


def _split_rows(manifest, name):
    """The prepared rows of a split, read from all its shards in order."""
    return [json.loads(line) for shard in manifest["splits"][name]["shards"]
            for line in storage.read_text(shard).splitlines()]


def _error(tmp_path, train, eval_uri=None, **overrides) -> DataError:
    cfg = _cfg(tmp_path, train, eval_uri, **overrides)
    with pytest.raises(DataError) as info:
        data.run(cfg, _ctx(tmp_path))
    return info.value


# --- bad inputs: each names the file and, where there is one, the line ------------------
def test_missing_file(tmp_path):
    missing = str(tmp_path / "nope.tsv")
    err = _error(tmp_path, missing)
    assert err.path == missing and "not found" in str(err)


def test_empty_file(tmp_path):
    err = _error(tmp_path, _write(tmp_path, "t.tsv", ""))
    assert "t.tsv" in str(err) and "empty" in str(err)


def test_header_only(tmp_path):
    err = _error(tmp_path, _write(tmp_path, "t.tsv", "text\tlabel\n"))
    assert err.line == 1 and "no data rows" in str(err)


def test_missing_column_lists_columns_found(tmp_path):
    err = _error(tmp_path, _write(tmp_path, "t.tsv", _tsv(GOOD, "sentence\tlabel")))
    assert err.line == 1
    assert "no column 'text'" in str(err) and "sentence, label" in str(err)


def test_empty_text(tmp_path):
    rows = GOOD[:2] + [("   ", "pos")] + GOOD[2:]
    err = _error(tmp_path, _write(tmp_path, "t.tsv", _tsv(rows)))
    assert err.line == 4 and "empty text in column 'text'" in str(err)
    assert "t.tsv, line 4" in str(err)


def test_unknown_label(tmp_path):
    rows = GOOD + [("so-so", "meh")]
    err = _error(tmp_path, _write(tmp_path, "t.tsv", _tsv(rows)), labels=["neg", "pos"])
    assert err.line == 6 and "'meh'" in str(err) and "allowed labels" in str(err)


def test_swapped_columns(tmp_path):
    rows = [(y, t) for t, y in GOOD * 3]  # texts in the label column
    rows = [(y, f"{t} number {i}") for i, (y, t) in enumerate(rows)]
    err = _error(tmp_path, _write(tmp_path, "t.tsv", _tsv(rows)))
    assert "looks like free text" in str(err) and "swapped" in str(err)
    assert "label_column" in str(err)


def test_invalid_utf8_names_line_and_offset(tmp_path):
    content = _tsv(GOOD).encode() + b"caf\xe9 au lait\tpos\n"
    err = _error(tmp_path, _write(tmp_path, "t.tsv", content))
    offset = content.index(b"\xe9")
    assert err.line == 6 and f"byte offset {offset}" in str(err) and "column 4" in str(err)


def test_malformed_json_line(tmp_path):
    lines = [json.dumps({"text": t, "label": y}) for t, y in GOOD]
    lines.insert(2, '{"text": "broken", "label": ')
    err = _error(tmp_path, _write(tmp_path, "t.jsonl", "\n".join(lines) + "\n"))
    assert err.line == 3 and "malformed JSON" in str(err)


def test_jsonl_record_missing_field(tmp_path):
    lines = [json.dumps({"text": t, "label": y}) for t, y in GOOD]
    lines.append(json.dumps({"text": "no label here"}))
    err = _error(tmp_path, _write(tmp_path, "t.jsonl", "\n".join(lines)))
    assert err.line == 5 and "no field 'label'" in str(err)


def test_single_class(tmp_path):
    err = _error(tmp_path, _write(tmp_path, "t.tsv", _tsv([(t, "pos") for t, _ in GOOD])))
    assert "only one class" in str(err) and "'label'" in str(err)


def test_eval_label_unseen_in_training(tmp_path):
    train = _write(tmp_path, "train.tsv", _tsv(GOOD))
    evals = _write(tmp_path, "eval.tsv", _tsv([("fine", "pos"), ("odd one", "neutral")]))
    err = _error(tmp_path, train, evals)
    assert err.path == evals and err.line == 3
    assert "'neutral' never appears in the training data" in str(err)


def test_wrong_field_count_in_tsv(tmp_path):
    content = _tsv(GOOD) + "a\ttab\tinside\tpos\n"
    err = _error(tmp_path, _write(tmp_path, "t.tsv", content))
    assert err.line == 6 and "expected 2 tab-separated fields" in str(err)


def test_csv_line_numbers_count_multiline_quoted_rows(tmp_path):
    content = 'text,label\n"two\nlines",pos\nok,neg\n,pos\n'
    err = _error(tmp_path, _write(tmp_path, "t.csv", content))
    assert err.line == 5 and "empty text" in str(err)


def test_tsv_fields_may_be_quoted_across_lines(tmp_path):
    # BANKING77's train.tsv holds a text quoted across a line break, like this.
    content = 'text\tlabel\nfine\tpos\n"\nHow do I unblock my PIN?"\tneg\n\tpos\n'
    err = _error(tmp_path, _write(tmp_path, "t.tsv", content))
    assert err.line == 5 and "empty text" in str(err)
    rows = data.load_source(parse_config({}), _write(tmp_path, "ok.tsv", content[:-5])).examples
    assert [r.text for r in rows] == ["fine", "How do I unblock my PIN?"]


def test_check_inputs_is_cheap_preflight(tmp_path):
    train = _write(tmp_path, "train.tsv", _tsv(GOOD))
    bad_eval = _write(tmp_path, "eval.tsv", _tsv(GOOD, "review\tlabel"))
    data.check_inputs(_cfg(tmp_path, train))
    with pytest.raises(DataError) as info:
        data.check_inputs(_cfg(tmp_path, train, bad_eval))
    assert info.value.path == bad_eval and "no column 'text'" in str(info.value)
    with pytest.raises(DataError, match="no data rows"):
        data.check_inputs(_cfg(tmp_path, _write(tmp_path, "h.tsv", "text\tlabel\n")))


# --- reading and outputs -------------------------------------------------------------------
def test_run_with_eval_file_writes_manifest_and_jsonl(tmp_path):
    train = _write(tmp_path, "train.tsv", _tsv([("good film ", "pos"), *GOOD[1:]]))
    evals = _write(tmp_path, "eval.tsv", _tsv([("fine", "pos"), ("awful", "neg")]))
    uri = data.run(_cfg(tmp_path, train, evals), _ctx(tmp_path))
    manifest = storage.read_json(uri)
    assert manifest["labels"] == ["neg", "pos"]  # sorted
    assert manifest["eval_source"] == "file" and manifest["has_pair"] is False
    assert manifest["splits"]["train"]["label_counts"] == {"neg": 2, "pos": 2}
    assert manifest["sources"]["eval"]["uri"] == evals
    assert len(manifest["sources"]["train"]["sha256"]) == 64
    rows = _split_rows(manifest, "train")
    assert rows[0] == {"text": "good film", "text_pair": None, "label": 1}  # space stripped


def test_labels_setting_fixes_vocabulary_order(tmp_path):
    train = _write(tmp_path, "train.tsv", _tsv(GOOD))
    uri = data.run(_cfg(tmp_path, train, labels=["pos", "neg", "mixed"]), _ctx(tmp_path))
    manifest = storage.read_json(uri)
    assert manifest["labels"] == ["pos", "neg", "mixed"]
    assert manifest["splits"]["train"]["label_counts"]["mixed"] == 0


def test_csv_and_jsonl_with_pairs_and_custom_columns(tmp_path):
    csv_text = 'premise,hypothesis,gold\n"A man, smiling",He is happy,yes\nRain,It is dry,no\n'
    train = _write(tmp_path, "t.csv", csv_text)
    jsonl = "\n".join(json.dumps({"premise": p, "hypothesis": h, "gold": g})
                      for p, h, g in [("Sun", "It is bright", "yes"), ("Cold", "Warm", "no")])
    evals = _write(tmp_path, "e.jsonl", jsonl)
    cfg = _cfg(tmp_path, train, evals, text_column="premise", text_pair_column="hypothesis",
               label_column="gold")
    manifest = storage.read_json(data.run(cfg, _ctx(tmp_path)))
    assert manifest["has_pair"] is True
    first = _split_rows(manifest, "train")[0]
    assert first == {"text": "A man, smiling", "text_pair": "He is happy", "label": 1}


def test_stratified_split_is_seeded_and_keeps_every_class(tmp_path):
    rows = [(f"text {i}", "a") for i in range(50)] + [(f"text b{i}", "b") for i in range(20)]
    rows += [("lonely one", "c"), ("pair one", "d"), ("pair two", "d")]
    train = _write(tmp_path, "t.tsv", _tsv(rows))
    cfg = _cfg(tmp_path, train, eval_fraction=0.2)
    examples = data.load_source(cfg, train).examples
    tr1, ev1 = data.stratified_split(examples, 0.2, seed=3)
    tr2, ev2 = data.stratified_split(examples, 0.2, seed=3)
    _, ev3 = data.stratified_split(examples, 0.2, seed=4)
    assert (tr1, ev1) == (tr2, ev2) and ev1 != ev3
    assert Counter(ex.label for ex in ev1) == {"a": 10, "b": 4, "d": 1}
    assert {ex.label for ex in tr1} == {"a", "b", "c", "d"}  # the single 'c' stays in train
    assert [ex.line for ex in tr1] == sorted(ex.line for ex in tr1)  # file order kept


def test_run_without_eval_file_splits(tmp_path):
    manifest = storage.read_json(data.run(
        _cfg(tmp_path, str(DEMO_DIR / "train.tsv")), _ctx(tmp_path)))
    assert manifest["eval_source"] == "split" and manifest["sources"]["eval"] is None
    train, evals = manifest["splits"]["train"], manifest["splits"]["eval"]
    assert all(n >= 9 for n in evals["label_counts"].values())
    assert train["num_examples"] + evals["num_examples"] == sum(
        1 for _ in open(DEMO_DIR / "train.tsv")) - 1


def test_make_demo_evaluates_on_the_demo_eval_file(tmp_path):
    """RunConfig's eval_uri is empty (a train file alone is split); make demo passes its own
    eval file, so the demo's run is the one it always was: 90 hand-written eval rows."""
    from bertflow_airflow.demo import DEMO_CONF

    cfg = parse_config({**DEMO_CONF, "artifact_root": str(tmp_path / "art")})
    manifest = storage.read_json(data.run(cfg, _ctx(tmp_path)))
    assert manifest["eval_source"] == "file"
    assert manifest["sources"]["eval"]["uri"] == str(DEMO_DIR / "eval.tsv")
    assert manifest["splits"]["eval"]["num_examples"] == sum(
        1 for _ in open(DEMO_DIR / "eval.tsv")) - 1


def test_demo_dataset_is_valid():
    from bertflow_airflow.demo import DEMO_CONF

    cfg = parse_config(DEMO_CONF)  # make demo's data: the demo's train and eval files
    data.check_inputs(cfg)
    train = data.load_source(cfg, cfg.train_uri).examples
    evals = data.load_source(cfg, cfg.eval_uri).examples
    assert len(train) >= 300 and len(evals) >= 90
    assert set(Counter(ex.label for ex in train)) == {"billing", "shipping", "technical"}
    assert not {ex.text for ex in train} & {ex.text for ex in evals}


# --- several files: prefixes and globs, on local disk and both emulators ------------------
PART_A = [("good film", "pos"), ("bad film", "neg"), ("great acting", "pos")]
PART_B = [("dull plot", "neg"), ("fine score", "pos"), ("weak ending", "neg")]


def _write_parts(root, parts):
    for name, content in parts.items():
        storage.write_text(f"{root}/{name}", content)


def _run_on(tmp_path, train, evals=None, **overrides):
    cfg = _cfg(tmp_path, train, evals, **overrides)
    return storage.read_json(data.run(cfg, _ctx(tmp_path)))


def test_prefix_and_glob_concatenate_sorted_files(root, tmp_path):  # noqa: F811
    _write_parts(root, {"train/part-1.tsv": _tsv(PART_B), "train/part-0.tsv": _tsv(PART_A),
                        "train/_SUCCESS": "", "train/notes.txt": "not data",
                        "eval.tsv": _tsv([("fine", "pos"), ("awful", "neg")])})
    for train in (f"{root}/train/", f"{root}/train/part-*.tsv"):
        manifest = _run_on(tmp_path, train, f"{root}/eval.tsv")
        files = manifest["sources"]["train"]["files"]
        assert [f["uri"] for f in files] == [f"{root}/train/part-0.tsv",
                                             f"{root}/train/part-1.tsv"]
        for f, rows in zip(files, (PART_A, PART_B)):
            assert f["sha256"] == hashlib.sha256(_tsv(rows).encode()).hexdigest()
        assert manifest["sources"]["train"]["uri"] == train
        assert manifest["sources"]["eval"]["files"] == [{
            "uri": f"{root}/eval.tsv", "sha256": manifest["sources"]["eval"]["sha256"]}]
        texts = [row["text"] for row in _split_rows(manifest, "train")]
        assert texts == [t for t, _ in PART_A + PART_B]  # sorted file order, row order kept


def test_errors_name_the_file_and_line_of_the_row(root, tmp_path):  # noqa: F811
    bad = _tsv(PART_B[:1] + [("  ", "pos")])
    _write_parts(root, {"d/a.tsv": _tsv(PART_A), "d/b.tsv": bad})
    with pytest.raises(DataError) as info:
        data.run(_cfg(tmp_path, f"{root}/d/*.tsv"), _ctx(tmp_path))
    assert info.value.path == f"{root}/d/b.tsv" and info.value.line == 3
    # Checks across rows, too: the unseen eval label is in the second eval file.
    _write_parts(root, {"e/1.tsv": _tsv([("ok", "pos")]), "e/2.tsv": _tsv([("hm", "meh")])})
    with pytest.raises(DataError, match="never appears") as info:
        data.run(_cfg(tmp_path, f"{root}/d/a.tsv", f"{root}/e/"), _ctx(tmp_path))
    assert (info.value.path, info.value.line) == (f"{root}/e/2.tsv", 2)


def test_nothing_matched_names_the_pattern(root, tmp_path):  # noqa: F811
    storage.write_text(f"{root}/d/_SUCCESS", "")
    for pattern, reason in ((f"{root}/d/", "no data files under this prefix"),
                            (f"{root}/d/*.csv", "the pattern matches no files"),
                            (f"{root}/missing/", "no data files under this prefix")):
        with pytest.raises(DataError, match=reason) as info:
            data.check_inputs(_cfg(tmp_path, pattern))
        assert info.value.path == pattern


def test_check_inputs_checks_every_matched_file(tmp_path):
    _write(tmp_path, "a.tsv", _tsv(GOOD))
    wrong = _write(tmp_path, "b.tsv", _tsv(GOOD, "review\tlabel"))
    with pytest.raises(DataError, match="no column 'text'") as info:
        data.check_inputs(_cfg(tmp_path, str(tmp_path / "*.tsv")))
    assert info.value.path == wrong


def test_explicit_format_reads_files_without_extension(tmp_path):
    (tmp_path / "out").mkdir()
    _write(tmp_path, "out/part-00000", _tsv(PART_A))
    _write(tmp_path, "out/part-00001", _tsv(PART_B))
    _write(tmp_path, "out/_SUCCESS", "")
    manifest = _run_on(tmp_path, str(tmp_path / "out") + "/", file_format="tsv")
    assert len(manifest["sources"]["train"]["files"]) == 2
    assert sum(s["num_examples"] for s in manifest["splits"].values()) == 6


# --- streaming: chunk boundaries, bounded memory, the split at scale ---------------------
def _stream_rows(monkeypatch, path, block_size, **overrides):
    """load_source with files read in blocks of `block_size` bytes."""
    monkeypatch.setattr(data, "BLOCK_SIZE", block_size)
    return data.load_source(parse_config(overrides), str(path)).examples


def test_quoted_field_spanning_blocks_crlf_and_bom(tmp_path, monkeypatch):
    content = ("\ufefftext,label\r\n"
               '"a text quoted across\r\ntwo lines, with a comma",pos\r\n'
               "plain row,neg\r\n"
               '"another ""quoted"" one",pos\r\n'
               ",neg\r\n").encode("utf-8")
    path = _write(tmp_path, "t.csv", content[:-len(",neg\r\n")])
    want = [("a text quoted across\r\ntwo lines, with a comma", "pos", 2),
            ("plain row", "neg", 4), ('another "quoted" one', "pos", 5)]
    for block_size in range(1, len(content) + 1):  # every cut position, BOM and CR/LF too
        rows = _stream_rows(monkeypatch, path, block_size)
        assert [(r.text, r.label, r.line) for r in rows] == want, block_size
    bad = _write(tmp_path, "bad.csv", content)  # the empty text on line 6
    for block_size in (1, 7, 13, 64):
        monkeypatch.setattr(data, "BLOCK_SIZE", block_size)
        err = _error(tmp_path, bad)
        assert (err.line, "empty text" in str(err)) == (6, True), block_size


def test_multibyte_utf8_cut_at_block_boundary(tmp_path, monkeypatch):
    texts = ["crème brûlée", "日本語のテキスト", "emoji 🙂 here", "ünïcödé"]
    path = _write(tmp_path, "t.tsv", _tsv([(t, "pos" if i % 2 else "neg")
                                           for i, t in enumerate(texts)]))
    for block_size in range(1, 40):  # cuts inside 2-, 3- and 4-byte characters
        assert [r.text for r in _stream_rows(monkeypatch, path, block_size)] == texts


def test_bad_byte_past_the_first_block_names_its_line(tmp_path, monkeypatch):
    rows = [(f"row number {i}", "pos" if i % 2 else "neg") for i in range(40)]
    content = _tsv(rows).encode() + b"caf\xe9 au lait\tpos\n" + _tsv(rows[:3]).encode()
    path = _write(tmp_path, "t.tsv", content)
    offset = content.index(b"\xe9")
    for block_size in (16, 64, 100, offset, offset + 1, 1 << 20):
        monkeypatch.setattr(data, "BLOCK_SIZE", block_size)
        err = _error(tmp_path, path)
        assert err.line == 42 and f"byte offset {offset}" in str(err), block_size
        assert "column 4" in str(err)


def test_jsonl_streamed_in_small_blocks_keeps_line_numbers(tmp_path, monkeypatch):
    lines = [json.dumps({"text": f"text {i} é", "label": i % 2}) for i in range(30)]
    lines.insert(20, "")
    lines.insert(25, '{"text": "broken", "label": ')
    path = _write(tmp_path, "t.jsonl", "\r\n".join(lines))
    for block_size in (5, 33, 1 << 20):
        monkeypatch.setattr(data, "BLOCK_SIZE", block_size)
        err = _error(tmp_path, path)
        assert err.line == 26 and "malformed JSON" in str(err)


def _classes_tsv(tmp_path, sizes, name="big.tsv"):
    rows = [(f"text {label} {i} {i * 7919 % 1000}", label)
            for label, n in sizes.items() for i in range(n)]
    rows.sort(key=lambda r: hashlib.md5(r[0].encode()).digest())  # classes interleaved
    return _write(tmp_path, name, _tsv(rows))


def test_split_is_exact_per_class_and_independent_of_blocks_and_shards(tmp_path, monkeypatch):
    sizes = {"a": 5000, "b": 1234, "c": 77, "d": 3, "e": 2, "f": 1}
    train = _classes_tsv(tmp_path, sizes)
    results = []
    for block_size, shard_rows in ((1 << 20, 1_000_000), (777, 1000)):
        monkeypatch.setattr(data, "BLOCK_SIZE", block_size)
        monkeypatch.setattr(prepared, "SHARD_ROWS", shard_rows)
        manifest = _run_on(tmp_path, train, eval_fraction=0.15, seed=7)
        evals = manifest["splits"]["eval"]
        # Stated tolerance: each class holds out round(n * f) rows exactly (within half a
        # row of its fraction), at least 1 and at most n - 1.
        assert evals["label_counts"] == {"a": 750, "b": 185, "c": 12, "d": 1, "e": 1, "f": 0}
        assert all(len(split["shards"]) == -(-split["num_examples"] // shard_rows)
                   for split in manifest["splits"].values())
        results.append({name: _split_rows(manifest, name) for name in ("train", "eval")})
    assert results[0] == results[1]  # same rows, same order, whatever the blocks and shards
    other_seed = _run_on(tmp_path, train, eval_fraction=0.15, seed=8)
    assert _split_rows(other_seed, "eval") != results[0]["eval"]


def test_data_step_memory_does_not_grow_with_rows(tmp_path, monkeypatch):
    """Peak traced memory of the whole step (both passes, the split, the shard writes) is
    set by the block and batch sizes, plus the leakage check's 8-byte key per row
    (tasks/steps/leakage.py): 8x the rows, about the same peak beyond those keys."""
    import tracemalloc

    monkeypatch.setattr(data, "BLOCK_SIZE", 16 << 10)
    monkeypatch.setattr(prepared, "_WRITE_BATCH", 512)
    monkeypatch.setattr(prepared, "SHARD_ROWS", 5000)
    peaks = []
    for n in (5_000, 40_000):
        train = _classes_tsv(tmp_path, {"x": n // 2, "y": n // 2}, name=f"{n}.tsv")
        tracemalloc.start()
        _run_on(tmp_path, train)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    keys = 8 * 1.15 * (40_000 - 5_000)  # array("Q") grows by about 1/8 at a time
    assert peaks[1] < 1.2 * peaks[0] + keys and peaks[1] < 1 << 20, peaks


# --- three roles: train, validation, test (the eval split) ---------------------------------
def test_validation_rows_are_drawn_after_test_and_leave_the_test_rows_unchanged(tmp_path):
    sizes = {"a": 500, "b": 120, "c": 9, "d": 2}
    train = _classes_tsv(tmp_path, sizes)
    two = _run_on(tmp_path, train, eval_fraction=0.2, seed=3)
    assert "validation" not in two["splits"] and two["validation_source"] is None
    two_rows = {name: _split_rows(two, name) for name in ("train", "eval")}  # one run folder
    three = _run_on(tmp_path, train, eval_fraction=0.2, seed=3, validation_fraction=0.25)
    # Turning validation on moves training rows only: the test rows stay the same.
    assert _split_rows(three, "eval") == two_rows["eval"]
    # Per class: round(left * 0.25) of the rows test left, at least 1, one kept for train.
    test_counts = three["splits"]["eval"]["label_counts"]
    assert test_counts == {"a": 100, "b": 24, "c": 2, "d": 1}
    assert three["splits"]["validation"]["label_counts"] == {"a": 100, "b": 24, "c": 2, "d": 0}
    rows = {name: [json.dumps(r) for r in _split_rows(three, name)]
            for name in ("train", "validation", "eval")}
    assert sum(map(len, rows.values())) == sum(sizes.values())
    assert not set(rows["validation"]) & (set(rows["train"]) | set(rows["eval"]))
    assert len(rows["train"]) + len(rows["validation"]) == len(two_rows["train"])
    assert three["validation_source"] == "split" and three["eval_source"] == "split"
    assert three["split_rule"]["validation_fraction"] == 0.25


def test_evaluating_in_training_holds_out_a_tenth_for_validation_by_default(tmp_path):
    train = _classes_tsv(tmp_path, {"a": 100, "b": 100})
    manifest = _run_on(tmp_path, train, eval_every_epoch=True)
    assert manifest["splits"]["validation"]["num_examples"] == 18  # 0.1 of the 90 left, x2
    plain = _run_on(tmp_path, train)  # no validation in the run: training keeps every row
    assert set(plain["splits"]) == {"train", "eval"}


def test_validation_and_test_files_fill_their_roles(tmp_path):
    train = _write(tmp_path, "train.tsv", _tsv(GOOD))
    dev = _write(tmp_path, "dev.tsv", _tsv([("fine", "pos")]))
    test = _write(tmp_path, "test.tsv", _tsv([("awful", "neg"), ("superb", "pos")]))
    manifest = _run_on(tmp_path, train, test_uri=test, validation_uri=dev,
                       eval_every_steps=1)
    assert [r["text"] for r in _split_rows(manifest, "validation")] == ["fine"]
    assert [r["text"] for r in _split_rows(manifest, "eval")] == ["awful", "superb"]
    assert manifest["splits"]["train"]["num_examples"] == len(GOOD)
    assert manifest["sources"]["validation"]["uri"] == dev
    assert manifest["sources"]["eval"]["uri"] == test
    assert (manifest["eval_source"], manifest["validation_source"]) == ("file", "file")
    assert "split_rule" not in manifest


def test_eval_uri_still_names_the_test_rows(tmp_path):
    train = _write(tmp_path, "train.tsv", _tsv(GOOD))
    test = _write(tmp_path, "test.tsv", _tsv([("awful", "neg")]))
    manifest = _run_on(tmp_path, train, test)  # the eval_uri Param
    assert [r["text"] for r in _split_rows(manifest, "eval")] == ["awful"]


def test_validation_label_unseen_in_training_names_file_line_and_label(tmp_path):
    train = _write(tmp_path, "train.tsv", _tsv(GOOD))
    dev = _write(tmp_path, "dev.tsv", _tsv([("fine", "pos"), ("meh", "neutral")]))
    err = _error(tmp_path, train, validation_uri=dev, eval_every_epoch=True)
    assert err.path == dev and err.line == 3
    assert "'neutral' never appears in the training data" in str(err)
    assert not storage.exists(str(tmp_path / "artifacts" / "runs"))  # nothing written


def test_too_few_rows_for_validation_says_which_file_to_give(tmp_path):
    train = _write(tmp_path, "train.tsv", _tsv(GOOD))  # 2 per class: 1 test, 1 train each
    err = _error(tmp_path, train, eval_every_epoch=True)
    assert "too few rows to hold out validation rows" in str(err)
    assert "add rows, or give a validation_uri" in str(err)


# --- test rows that are also training rows ----------------------------------------------------
def test_test_rows_found_in_training_are_counted_with_examples(tmp_path, capsys):
    train = _write(tmp_path, "train.tsv", _tsv(GOOD + [("Caf\u00e9 ,  GREAT!", "pos")]))
    # The same texts after BERT's normalization (case, accents, spaces around punctuation).
    test = _write(tmp_path, "test.tsv", _tsv([("cafe, great !", "pos"), ("GOOD film", "pos"),
                                              ("a new text", "neg")]))
    manifest = _run_on(tmp_path, train, test)
    assert manifest["leakage"] == {"test_rows_in_train": 2,
                                   "examples": ["cafe, great !", "GOOD film"]}
    assert "warning: 2 test rows also appear in the training data" in capsys.readouterr().out
    err = _error(tmp_path, train, test, fail_on_leakage=True)
    assert err.path == test and "2 test rows also appear in the training data" in str(err)
    assert "fail_on_leakage" in str(err)
    clean = _write(tmp_path, "clean.tsv", _tsv([("a new text", "neg")]))
    assert _run_on(tmp_path, train, clean, fail_on_leakage=True)["leakage"] == {
        "test_rows_in_train": 0, "examples": []}


def test_a_cased_run_tells_cased_texts_apart(tmp_path):
    train = _write(tmp_path, "train.tsv", _tsv(GOOD))
    test = _write(tmp_path, "test.tsv", _tsv([("GOOD FILM", "pos"), ("good film", "pos")]))
    manifest = _run_on(tmp_path, train, test, lower_case=False,
                        lower_case_override=True)  # the default checkpoint lower-cases
    assert manifest["leakage"]["test_rows_in_train"] == 1
