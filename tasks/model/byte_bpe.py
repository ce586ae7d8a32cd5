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
   Most texts take a shorter exact path (`pretokenize`): with no run of 2+ space characters
   before a non-space the lookahead never fires and one split does, and on an ASCII text
   ASCII character classes replace the Unicode ones, which RE2 matches several times slower.
2. Each word's UTF-8 bytes become GPT-2's printable stand-ins (`bytes_to_unicode`), one
   symbol per byte, held as its vocab.json id. A batch's repeated words are merged once.
3. Merges: a tf.while_loop over all the batch's distinct words at once. Each round looks up
   every adjacent pair's rank (a StaticHashTable of the pair of ids -> line of merges.txt),
   takes each word's lowest rank and merges its occurrences left to right without overlap
   (what GPT-2's `bpe` and `tokenizers` do). Words with no mergeable pair left leave the
   loop, so a round costs only the words still merging. No string is built in the loop.

Not done here: `tokenizers` also matches added tokens (`<s>`, `<mask>`...) inside the raw
text and gives their ids; here such text is tokenized as ordinary characters.
"""
from __future__ import annotations

import json

import tensorflow as tf
import tensorflow_text as tf_text

from tasks.io import storage
from tasks.model.text_encoder import SegmentEncoder

_NO_RANK = tf.int64.max


def _patterns(space: str, letter: str, number: str) -> dict[str, str]:
    """The regexes of pre-tokenization for one set of character classes."""
    s, ns = f"[{space}]", f"[^{space}]"
    return {
        # Stage 1: a space run with the non-space run after it, or a trailing space run.
        "runs": f"{s}*{ns}+|{s}+",
        "split_run": f"^({s}*)({s}{ns}+)$",  # (W[:-1], last space character + N)
        # Stage 2: GPT-2's regex less `\s+(?!\S)` (it cannot match in a piece from split_run,
        # nor anywhere in a text that `one_split` matches).
        "words": (f"'s|'t|'re|'ve|'m|'ll|'d| ?[{letter}]+| ?[{number}]+"
                  f"| ?[^{space}{letter}{number}]+|{s}+"),
        # No run of 2+ space characters before a non-space: the lookahead never fires.
        "one_split": f"(?:{s}?{ns})*{s}*",
    }


# Oniguruma's Unicode \s (checked against `tokenizers` over every code point in
# tests/test_byte_bpe.py); RE2's \s is [\t\n\f\r ] only.
_UNICODE = _patterns(r"\t\n\x0b\f\r\x{85}\p{Z}", r"\p{L}", r"\p{N}")
# The same classes restricted to ASCII, exact on an ASCII text (no other ASCII character is
# in \p{L}, \p{N} or \p{Z}). RE2 runs them about 4x faster: regex_split asks for the match
# as a submatch, and RE2's submatch engine walks \p{L}'s hundreds of UTF-8 byte ranges.
_ASCII = _patterns(r"\t\n\x0b\f\r ", "A-Za-z", "0-9")


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
    concatenation is each text (every character falls into one word).

    Each text takes the cheapest exact path of four (ASCII or Unicode classes, one regex
    split or two); most English text is ASCII with single spaces, one split of fast classes.
    A text that is not valid UTF-8 matches neither check and takes the general path."""
    is_ascii = tf.strings.regex_full_match(texts, r"[\x00-\x7f]*")
    one_split = tf.strings.regex_full_match(texts, _UNICODE["one_split"])  # no submatch: fast
    path = tf.cast(is_ascii, tf.int32) + 2 * tf.cast(one_split, tf.int32)
    groups = tf.dynamic_partition(texts, path, 4)
    positions = tf.dynamic_partition(tf.range(tf.size(texts)), path, 4)
    words = []
    for number, group in enumerate(groups):
        patterns = _ASCII if number % 2 else _UNICODE
        words.append(_split(group, patterns["words"]) if number >= 2
                     else _split_twice(group, patterns))
    # Back in the texts' order.
    return tf.gather(tf.concat(words, 0), tf.math.invert_permutation(tf.concat(positions, 0)))


def _split_twice(texts: tf.Tensor, patterns: dict[str, str]) -> tf.RaggedTensor:
    """Pre-tokenization of texts where `\\s+(?!\\S)` may fire: see the module's docstring."""
    runs = _split(texts, patterns["runs"])  # [batch, (runs)]
    pieces = runs.flat_values
    split_run = patterns["split_run"]
    split = tf.strings.regex_full_match(pieces, split_run)
    head = tf.where(split, tf.strings.regex_replace(pieces, split_run, r"\1"), "")
    rest = tf.where(split, tf.strings.regex_replace(pieces, split_run, r"\2"), pieces)
    words = _split(rest, patterns["words"])  # [runs, (words)]
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
    <s>/</s>). The vocabulary and merges become constants and a hash table inside the module
    (and so inside a SavedModel): serving needs neither file."""

    def __init__(self, vocab_path, merges_path, name: str = "byte_bpe",
                 vocab: dict[str, int] | None = None):
        """`vocab`: vocab.json already read (read_vocab), not read again."""
        super().__init__(name=name)
        self.vocab = vocab if vocab is not None else read_vocab(vocab_path)
        byte_chars = bytes_to_unicode()
        # Each byte's id; -1: a byte missing from the vocabulary (one trained without the full
        # byte alphabet), dropped before merging, as `tokenizers` drops it when the BPE has no
        # unk token (RoBERTa's has none).
        self._byte_ids = tf.constant([self.vocab.get(byte_chars[b], -1) for b in range(256)],
                                     tf.int64)
        # A pair of ids is one int64 key, left * width + right: the merge loop looks up ints,
        # never building or hashing a string.
        self._width = max(self.vocab.values()) + 1
        ranks, merged = _merge_ids(self.vocab, read_merges(merges_path), vocab_path,
                                   merges_path)
        self._ranks = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
            tf.constant([a * self._width + b for a, b in ranks], tf.int64),
            tf.constant(list(ranks.values()), tf.int64)), default_value=_NO_RANK)
        self._merged = tf.constant(merged, tf.int64)  # rank -> the merged piece's id

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
    def tokenize(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """A tf.function also when called eagerly (the tokenize step): the merge loop runs
        as a graph, several times faster than op by op."""
        words = pretokenize(texts)  # [batch, (words)]
        # A batch repeats its words (2,000 texts of SST-2 and GoEmotions: 26,000 words, 6,000
        # distinct): each distinct word is merged once. The in-graph stand-in for the word
        # cache of `tokenizers`.
        distinct, index = tf.unique(words.flat_values)
        pieces = tf.gather(self.bpe(distinct), index)  # [words, (pieces)]
        return words.with_flat_values(pieces).merge_dims(1, 2)

    def bpe(self, words: tf.Tensor) -> tf.RaggedTensor:
        """Words [n] -> their BPE pieces' ids [n, (pieces)]."""
        # All bytes of all words in one tensor, each made its symbol's id.
        raw = tf.io.decode_raw(tf.strings.reduce_join(words), tf.uint8)
        symbols = tf.gather(self._byte_ids, tf.cast(raw, tf.int32))
        owner = tf.repeat(tf.range(tf.size(words, tf.int64)),
                          tf.cast(tf.strings.length(words), tf.int64))
        known = symbols >= 0
        symbols, owner = symbols[known], owner[known]
        done_symbols = tf.zeros([0], tf.int64)
        done_owner = tf.zeros([0], tf.int64)

        def active(symbols, owner, done_symbols, done_owner):
            return tf.size(symbols) > 0

        def merge_round(symbols, owner, done_symbols, done_owner):
            left, right = symbols[:-1], symbols[1:]
            same_word = tf.equal(owner[:-1], owner[1:])
            ranks = tf.where(same_word, self._ranks.lookup(left * self._width + right),
                             _NO_RANK)
            best = tf.math.unsorted_segment_min(ranks, owner[:-1], tf.size(words, tf.int64))
            hit = (ranks < _NO_RANK) & tf.equal(ranks, tf.gather(best, owner[:-1]))
            merge_at = _left_to_right(hit)
            # Words with nothing left to merge leave the loop.
            finished = tf.gather(tf.equal(best, _NO_RANK), owner)
            done_symbols = tf.concat([done_symbols, symbols[finished]], 0)
            done_owner = tf.concat([done_owner, owner[finished]], 0)
            joined = tf.gather(self._merged, tf.where(merge_at, ranks, 0))
            starts = tf.concat([merge_at, [False]], 0)
            absorbed = tf.concat([[False], merge_at], 0)
            merged = tf.where(starts, tf.concat([joined, [0]], 0), symbols)
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


def _merge_ids(vocab: dict[str, int], merges: list[tuple[str, str]], vocab_path,
               merges_path) -> tuple[dict[tuple[int, int], int], list[int]]:
    """({(left id, right id): rank}, [merged piece's id by rank]). A merge listed twice keeps
    its last rank, as `tokenizers` and GPT-2's `bpe` do."""
    ranks, merged = {}, []
    for rank, (a, b) in enumerate(merges):
        missing = [p for p in (a, b, a + b) if p not in vocab]
        if missing:  # `tokenizers` refuses such a pair of files too
            raise ValueError(f"{merges_path}: the merge '{a} {b}' needs {missing[0]!r}, which "
                             f"is not in {vocab_path}; vocab.json and merges.txt must come "
                             "from the same tokenizer")
        ranks[vocab[a], vocab[b]] = rank
        merged.append(vocab[a + b])
    return ranks, merged


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
        vocab = tokenizer.vocab if tokenizer else read_vocab(vocab_path)
        missing = [t for t in self.SPECIALS if t not in vocab]
        if missing:  # before the merges are read: the more basic fault is named first
            raise ValueError(f"{vocab_path}: no {', '.join(missing)} in the vocabulary; a "
                             f"RoBERTa vocab.json has {', '.join(self.SPECIALS)}")
        self.tokenizer = tokenizer or ByteBpeTokenizer(vocab_path, merges_path, vocab=vocab)
        self.vocab_size = max(vocab.values()) + 1
        self.lower_case = False  # byte-level BPE keeps the text as it is
        self.max_seq_length = max_seq_length
        self._cls_id, self._sep_id = vocab["<s>"], vocab["</s>"]
        self.pad_id, self.unk_id = vocab["<pad>"], vocab["<unk>"]

    def wordpieces(self, texts) -> tf.RaggedTensor:
        return self.tokenizer.tokenize(texts)
