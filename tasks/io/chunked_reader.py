"""Streaming text reading in bounded memory: byte blocks -> blocks of whole lines -> lines.

Any byte source (`tasks.io.storage.iter_bytes`: a local file, ranged reads of a gs:// or s3://
object) is cut into blocks that end at a newline, so that

- a multi-byte UTF-8 character is never cut (0x0A never occurs inside one), and a decoding
  error names its file line and byte offset exactly as decoding the whole file did;
- CRLF stays together (a block never ends between \\r and \\n);
- a CSV/TSV field quoted across lines spans blocks naturally: the csv module reads lines from
  one iterator over all blocks, and its `line_num` counts the file's lines.

Memory is one block (BLOCK_SIZE, plus the longest line when a line is longer), whatever the
file's size. A leading UTF-8 BOM is dropped; the sha256 and size of the raw bytes are computed
as they pass.
"""
from __future__ import annotations

import codecs
import hashlib
import io
from typing import Iterable, Iterator

from tasks.errors import DataError

BLOCK_SIZE = 8 << 20  # bytes per read; the data step's memory is a few of these


def line_blocks(blocks: Iterable[bytes]) -> Iterator[bytes]:
    """The bytes of `blocks` regrouped into blocks of whole lines (the last one may lack its
    newline)."""
    pending = b""
    for block in blocks:
        buf = pending + block if pending else block
        cut = buf.rfind(b"\n") + 1
        if cut == 0:
            pending = buf  # a line longer than the block: keep reading
            continue
        yield buf[:cut] if cut < len(buf) else buf
        pending = buf[cut:]
    if pending:
        yield pending


class TextStream:
    """The UTF-8 text of one file, read block by block.

    `text_blocks()` yields decoded blocks of whole lines; `lines()` yields lines with their
    endings (\\n, \\r\\n or \\r, as `open(newline="")` splits them, so csv sees what it saw
    when given the whole file). After the stream is exhausted, `sha256` and `size` describe
    every byte read. Raises DataError "file is empty" for a file of only whitespace, and
    "not valid UTF-8" with the line (newlines before the bad byte + 1), the byte offset in the
    file and the column (byte in its line).
    """

    def __init__(self, uri: str, blocks: Iterable[bytes]):
        self.uri = uri
        self._blocks = blocks
        self._digest = hashlib.sha256()
        self.size = 0
        self.finished = False

    @property
    def sha256(self) -> str:
        if not self.finished:
            raise RuntimeError("sha256 of a stream that was not read to its end")
        return self._digest.hexdigest()

    def _hashed(self) -> Iterator[bytes]:
        head = []  # leading whitespace-only blocks: an all-whitespace file is "empty"
        started = False
        for block in self._blocks:
            self._digest.update(block)
            self.size += len(block)
            if not started:
                if not block.strip():
                    head.append(block)
                    continue
                started = True
                if head:
                    block = b"".join(head) + block
                    head = []
            yield block
        self.finished = True
        if not started:
            raise DataError(self.uri, "file is empty")

    def text_blocks(self) -> Iterator[str]:
        offset = 0  # bytes of the file before the current block
        lines = 0  # newlines before the current block
        for block in line_blocks(self._hashed()):
            skip = 3 if offset == 0 and block.startswith(codecs.BOM_UTF8) else 0
            try:
                text = block[skip:].decode("utf-8")
            except UnicodeDecodeError as err:
                at = err.start + skip
                line_start = block.rfind(b"\n", 0, at) + 1
                raise DataError(
                    self.uri, f"not valid UTF-8: byte 0x{block[at]:02x} at byte offset "
                              f"{offset + at} (column {at - line_start + 1} of the line)",
                    line=lines + block.count(b"\n", 0, at) + 1,
                    hint="re-save the file as UTF-8") from None
            offset += len(block)
            lines += block.count(b"\n")
            yield text

    def lines(self) -> Iterator[str]:
        for text in self.text_blocks():
            yield from io.StringIO(text, newline="")
