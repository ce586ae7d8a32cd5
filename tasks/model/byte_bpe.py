"""Byte-level BPE (GPT-2's, RoBERTa's) in the graph, from TensorFlow and tensorflow-text ops
only: a SavedModel holding it loads with `tensorflow` and `tensorflow_text`, no custom op.

    tokenizer = ByteBpeTokenizer(vocab_json, merges_txt)
    ids = tokenizer.tokenize(tf.constant(["Hello world"]))  # int64 [batch, (pieces)]
    encoder = RobertaTextEncoder(vocab_json, merges_txt, max_seq_length=128)
    ids, types = encoder(texts, pairs)  # <s> A </s></s> B </s>, types all 0

`RobertaTextEncoder` has BertTextEncoder's interface (tasks/model/text_encoder.py), so the
tokenize step and the export step can take either.

Three stages, as Hugging Face `tokenizers` runs them for RoBERTa (ByteLevel pre-tokenizer,
add_prefix_space false; BPE model):

1. Pre-tokenization: GPT-2's regex
       's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
   RE2 has no lookahead, so `\\s+(?!\\S)` is done in two splits (`pretokenize`). The rule
   only matters for a whitespace run W followed by a non-space: GPT-2 makes W minus its last
   character one word, and tokenizes that last character together with the non-space run N
   after it (a ' ' then joins N's first word through ` ?`; another space character stands
   alone). So the first split cuts the text into "W + N" pieces (and a trailing W); a piece
   whose W is longer than one character gives W[:-1] as a word (an RE2 capture finds it: the
   greedy `(\\s*)\\s\\S` leaves exactly one space character to the second group), and the rest,
   at most one space character and then no space, is split by the regex without the
   lookahead alternative, which cannot fire there. `\\s` is Oniguruma's (what `tokenizers`
   uses): [\\t\\n\\v\\f\\r\\x85\\p{Z}], not RE2's ASCII one.
2. Each word's UTF-8 bytes become GPT-2's printable stand-ins (`bytes_to_unicode`), one
   symbol per byte.
3. Merges: a tf.while_loop over all the batch's words at once. Each round looks up every
   adjacent pair's rank (a StaticHashTable of "left right" -> line of merges.txt), takes each
   word's lowest rank and merges its occurrences left to right without overlap (what GPT-2's
   `bpe` and `tokenizers` do). Words with no mergeable pair left leave the loop, so a round
   costs only the words still merging. Symbols are then looked up in vocab.json.

Not done here: `tokenizers` also matches added tokens (`<s>`, `<mask>`...) inside the raw
text and gives their ids; here such text is tokenized as ordinary characters.
"""
from __future__ import annotations

import json

import tensorflow as tf
import tensorflow_text as tf_text

from tasks.io import storage
from tasks.model.text_encoder import SegmentEncoder

# Oniguruma's Unicode \s (checked against `tokenizers` over every code point in
# tests/test_byte_bpe.py); RE2's \s is [\t\n\f\r ] only.
_WS = r"\t\n\x0b\f\r\x{85}\p{Z}"
_S, _NS = f"[{_WS}]", f"[^{_WS}]"
# Stage 1: a space run with the non-space run after it, or a trailing space run.
_RUNS = f"{_S}*{_NS}+|{_S}+"
_SPLIT_RUN = f"^({_S}*)({_S}{_NS}+)$"  # (W[:-1], last space character + N)
# Stage 2: GPT-2's regex less `\s+(?!\S)` (it cannot match in a piece from _SPLIT_RUN).
_WORDS = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+"
          f"| ?[^{_WS}\\p{{L}}\\p{{N}}]+|{_S}+")
_NO_RANK = tf.int64.max


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map of the 256 byte values to printable characters (the printable Latin-1
    ones stand for themselves, the others are shifted to 256 and up)."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
            + list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def pretokenize(texts: tf.Tensor) -> tf.RaggedTensor:
    """GPT-2's pre-tokenization of a [batch] string tensor: [batch, (words)] strings whose
    concatenation is each text (every character falls into one word)."""
    runs = _split(texts, _RUNS)  # [batch, (runs)]
    pieces = runs.flat_values
    split = tf.strings.regex_full_match(pieces, _SPLIT_RUN)
    head = tf.where(split, tf.strings.regex_replace(pieces, _SPLIT_RUN, r"\1"), "")
    rest = tf.where(split, tf.strings.regex_replace(pieces, _SPLIT_RUN, r"\2"), pieces)
    words = _split(rest, _WORDS)  # [runs, (words)]
    # Each run gives its head (when not empty) and then its words: flat positions in the
    # output, stitched together (cheaper to trace and run than ragged concat and mask).
    has_head = tf.strings.length(head) > 0
    counts = words.row_lengths() + tf.cast(has_head, tf.int64)
    starts = tf.math.cumsum(counts, exclusive=True)
    word_at = (tf.gather(starts + tf.cast(has_head, tf.int64), words.value_rowids())
               + tf.ragged.range(words.row_lengths()).flat_values)
    flat = tf.dynamic_stitch(  # int32 indices: the op takes no others
        [tf.cast(tf.boolean_mask(starts, has_head), tf.int32), tf.cast(word_at, tf.int32)],
        [tf.boolean_mask(head, has_head), words.flat_values])
    per_text = tf.math.unsorted_segment_sum(counts, runs.value_rowids(), runs.nrows())
    return tf.RaggedTensor.from_row_lengths(flat, per_text)


def _split(texts: tf.Tensor, pattern: str) -> tf.RaggedTensor:
    """[n] strings -> [n, (matches)] of `pattern`, which must match every character.

    tensorflow_text's regex_split stops at a NUL byte, so it splits a copy with each NUL
    made \\x01 (a control character too: the same class for every pattern here, and one byte,
    so the offsets hold) and the matches are cut from the original by offset."""
    safe = tf.strings.regex_replace(texts, r"\x00", "\x01")
    _, begin, end = tf_text.regex_split_with_offsets(safe, pattern, pattern)
    source = tf.gather(texts, begin.value_rowids())
    return begin.with_flat_values(
        tf.strings.substr(source, begin.flat_values, end.flat_values - begin.flat_values))


class ByteBpeTokenizer(tf.Module):
    """vocab.json + merges.txt -> `tokenize(texts)`: int64 ids [batch, (pieces)], without
    special tokens, equal to `tokenizers`' byte-level BPE (RobertaTokenizerFast without
    <s>/</s>). The vocabulary and merges become hash tables inside the module (and so inside
    a SavedModel): serving needs neither file."""

    def __init__(self, vocab_path, merges_path, name: str = "byte_bpe"):
        super().__init__(name=name)
        self.vocab = read_vocab(vocab_path)
        merges = read_merges(merges_path)
        byte_chars = bytes_to_unicode()
        self._bytes = _table([bytes([b]) for b in range(256)],
                             [byte_chars[b].encode() for b in range(256)], b"")
        self._ranks = _table([f"{a} {b}" for a, b in merges], range(len(merges)), _NO_RANK)
        self._ids = _table(list(self.vocab), list(self.vocab.values()), -1)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def tokenize(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """A tf.function also when called eagerly (the tokenize step): the merge loop runs
        as a graph, several times faster than op by op."""
        words = pretokenize(texts)  # [batch, (words)]
        pieces = self.bpe(words.flat_values)  # [words, (pieces)]
        ids = self._ids.lookup(pieces.flat_values)
        # A byte missing from the vocabulary (a vocab.json trained without the full byte
        # alphabet) is dropped, as `tokenizers` drops it when the BPE has no unk token.
        per_text = words.with_flat_values(pieces.with_flat_values(ids)).merge_dims(1, 2)
        return tf.ragged.boolean_mask(per_text, per_text >= 0)

    def bpe(self, words: tf.Tensor) -> tf.RaggedTensor:
        """Words [n] -> their BPE pieces [n, (pieces)], as byte-level symbol strings."""
        chars = self._bytes.lookup(tf.strings.bytes_split(words))  # [n, (bytes)]
        symbols, owner = chars.flat_values, chars.value_rowids()
        done_symbols = tf.zeros([0], tf.string)
        done_owner = tf.zeros([0], tf.int64)

        def active(symbols, owner, done_symbols, done_owner):
            return tf.size(symbols) > 0

        def merge_round(symbols, owner, done_symbols, done_owner):
            left, right = symbols[:-1], symbols[1:]
            same_word = tf.equal(owner[:-1], owner[1:])
            ranks = tf.where(same_word, self._ranks.lookup(
                tf.strings.join([left, right], separator=" ")), _NO_RANK)
            best = tf.math.unsorted_segment_min(ranks, owner[:-1], tf.size(words, tf.int64))
            hit = (ranks < _NO_RANK) & tf.equal(ranks, tf.gather(best, owner[:-1]))
            merge_at = _left_to_right(hit)
            # Words with nothing left to merge leave the loop.
            finished = tf.gather(tf.equal(best, _NO_RANK), owner)
            done_symbols = tf.concat([done_symbols, symbols[finished]], 0)
            done_owner = tf.concat([done_owner, owner[finished]], 0)
            joined = tf.strings.join([left, right])
            starts = tf.concat([merge_at, [False]], 0)
            absorbed = tf.concat([[False], merge_at], 0)
            merged = tf.where(starts, tf.concat([joined, [""]], 0), symbols)
            keep = ~finished & ~absorbed
            return merged[keep], owner[keep], done_symbols, done_owner

        _, _, done_symbols, done_owner = tf.while_loop(
            active, merge_round, (symbols, owner, done_symbols, done_owner),
            shape_invariants=(tf.TensorShape([None]),) * 4)
        # Words left in rounds' order: put them back in order (the sort is stable, so each
        # word's pieces keep theirs).
        order = tf.argsort(done_owner, stable=True)
        return tf.RaggedTensor.from_value_rowids(
            tf.gather(done_symbols, order), tf.gather(done_owner, order),
            nrows=tf.size(words, tf.int64))


def _left_to_right(hit: tf.Tensor) -> tf.Tensor:
    """Of each run of consecutive hits (the same pair overlapping itself, as in "a a a"), the
    1st, 3rd, 5th...: GPT-2 merges left to right, and a merged symbol cannot merge again in
    the same round."""
    position = tf.range(tf.size(hit, tf.int64))
    run = tf.math.cumsum(tf.cast(~hit, tf.int64))  # runs start after each miss
    run_start = tf.math.unsorted_segment_min(position, run, tf.size(hit, tf.int64) + 1)
    # Segment k > 0 begins at its miss, so its hits start one after; segment 0 has no miss.
    offset = position - tf.gather(run_start, run) - tf.cast(run > 0, tf.int64)
    return hit & tf.equal(offset % 2, 0)


def _table(keys, values, default) -> tf.lookup.StaticHashTable:
    keys = tf.constant(list(keys), tf.string)
    values = tf.constant(list(values), tf.string if isinstance(default, bytes) else tf.int64)
    return tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, values),
                                     default_value=tf.constant(default, values.dtype))


def read_vocab(path) -> dict[str, int]:
    """vocab.json: {piece: id}."""
    try:
        vocab = json.loads(storage.read_text(str(path)))
    except ValueError as err:
        raise ValueError(f"{path}: not JSON ({err}); a byte-level BPE vocab.json maps each "
                         "piece to its id") from None
    if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
        raise ValueError(f"{path}: expected a JSON object of piece -> integer id")
    return vocab


def read_merges(path) -> list[tuple[str, str]]:
    """merges.txt: one merge "left right" a line, in rank order; a first line starting with
    "#version" is a header."""
    merges = []
    for number, line in enumerate(storage.read_text(str(path)).split("\n"), 1):
        if not line or (number == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"{path} line {number}: {line!r} is not a merge 'left right'")
        merges.append((parts[0], parts[1]))
    return merges


class RobertaTextEncoder(SegmentEncoder):
    """Raw strings -> RoBERTa input ids: `<s> A </s>` or `<s> A </s></s> B </s>`, no token
    types, truncated like RobertaTokenizerFast's 'longest_first' (4 specials for a pair)."""

    PAIR_SEPARATORS = 2
    TOKEN_TYPES = False
    # A word of a pre-split sentence reads as after a space, its first piece carrying Ġ
    # (RobertaTokenizerFast with add_prefix_space=True, is_split_into_words=True).
    WORD_PREFIX = " "
    SPECIALS = ("<s>", "</s>", "<pad>", "<unk>")

    def __init__(self, vocab_path, merges_path, max_seq_length: int = 128,
                 tokenizer: ByteBpeTokenizer | None = None):
        """`tokenizer`: an existing ByteBpeTokenizer of the same files to share (its traced
        graph with it), e.g. for encoders of several lengths."""
        super().__init__(name="roberta_text_encoder")
        self.tokenizer = tokenizer or ByteBpeTokenizer(vocab_path, merges_path)
        vocab = self.tokenizer.vocab
        missing = [t for t in self.SPECIALS if t not in vocab]
        if missing:
            raise ValueError(f"{vocab_path}: no {', '.join(missing)} in the vocabulary; a "
                             f"RoBERTa vocab.json has {', '.join(self.SPECIALS)}")
        self.vocab_size = max(vocab.values()) + 1
        self.lower_case = False  # byte-level BPE keeps the text as it is
        self.max_seq_length = max_seq_length
        self._cls_id, self._sep_id = vocab["<s>"], vocab["</s>"]
        self.pad_id, self.unk_id = vocab["<pad>"], vocab["<unk>"]

    def wordpieces(self, texts) -> tf.RaggedTensor:
        return self.tokenizer.tokenize(texts)
