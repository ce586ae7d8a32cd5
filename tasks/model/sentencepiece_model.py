"""A SentencePiece model file (`sentencepiece.bpe.model`, `spm.model`) as bertflow reads it,
without TensorFlow (validate's checks) and without the sentencepiece package: its pieces and
their types, and each family's ids around them (`IdLayout`). The in-graph encoder is
tasks/model/sentencepiece_text.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from tasks.io import storage

# SentencePiece's piece types (sentencepiece_model.proto).
UNKNOWN, CONTROL = 2, 3
UNIGRAM = 1  # TrainerSpec.model_type; 2 is BPE


@dataclass(frozen=True)
class SpmModel:
    """What bertflow reads of a SentencePiece model file: its pieces in id order, each
    piece's type and score, the normalizer's precompiled character map (for the HF export) and
    the kind of model (unigram or BPE)."""

    pieces: tuple[str, ...]
    scores: tuple[float, ...]
    types: tuple[int, ...]
    charsmap: bytes
    model_type: int

    @property
    def unk_id(self) -> int:
        return self.types.index(UNKNOWN)


def read_model(path) -> tuple[bytes, SpmModel]:
    """The model file's bytes and what they hold (`parse_model`)."""
    data = storage.read_bytes(str(path))
    return data, parse_model(data, str(path))


def parse_model(data: bytes, where: str) -> SpmModel:
    """A model file's content; one that is not a SentencePiece model raises ValueError naming
    `where`. Parsed with transformers' copy of sentencepiece_model.proto (or the sentencepiece
    package's, when installed): the sentencepiece package is not needed."""
    from transformers.convert_slow_tokenizer import import_protobuf

    proto = import_protobuf().ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as err:  # protobuf's DecodeError, or worse on random bytes
        raise ValueError(f"{where}: not a SentencePiece model ({err})") from None
    if not proto.pieces or sum(p.type == UNKNOWN for p in proto.pieces) != 1:
        raise ValueError(f"{where}: not a SentencePiece model (a model has pieces, one of "
                         "them the unknown piece)")
    return SpmModel(tuple(p.piece for p in proto.pieces), tuple(p.score for p in proto.pieces),
                    tuple(p.type for p in proto.pieces),
                    bytes(proto.normalizer_spec.precompiled_charsmap),
                    proto.trainer_spec.model_type)


@dataclass(frozen=True)
class IdLayout:
    """A family's ids around a SentencePiece model's pieces: the special tokens' ids, the
    shift added to every piece id, and the ids after the last piece (XLM-R's <mask>). The
    model's unknown piece is given `unk`."""

    cls: int
    sep: int
    pad: int
    unk: int
    offset: int = 0
    extra: int = 0

    def vocab_size(self, model: SpmModel) -> int:
        return len(model.pieces) + self.offset + self.extra


# fairseq's dictionary as XLM-R uses it (transformers' XLMRobertaConverter).
FAIRSEQ = IdLayout(cls=0, pad=1, sep=2, unk=3, offset=1, extra=1)
# DeBERTa-v3's spm.model holds its special pieces itself ([PAD] [CLS] [SEP] [UNK] at 0-3 in
# microsoft/deberta-v3-*; [MASK] is an added token after the pieces): ids are piece ids.
DEBERTA_SPECIALS = ("[CLS]", "[SEP]", "[PAD]")


def deberta_layout(model: SpmModel, where: str = "spm.model") -> IdLayout:
    """DeBERTa-v3's ids, read from its model's pieces (what DebertaV2Tokenizer's vocabulary
    gives them); a model without those pieces raises ValueError naming `where`."""
    missing = [p for p in DEBERTA_SPECIALS if p not in model.pieces]
    if missing:
        raise ValueError(f"{where}: no {', '.join(missing)} piece; a DeBERTa-v3 spm.model "
                         f"has {' '.join(DEBERTA_SPECIALS)} among its pieces")
    cls, sep, pad = (model.pieces.index(p) for p in DEBERTA_SPECIALS)
    return IdLayout(cls=cls, sep=sep, pad=pad, unk=model.unk_id)


# Each SentencePiece family's layout of a model (validate's vocabulary-size check reads it).
LAYOUTS = {"xlm-roberta": lambda model, where: FAIRSEQ, "deberta-v2": deberta_layout}
