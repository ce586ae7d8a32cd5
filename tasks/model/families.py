"""Every model family bertflow fine-tunes, one row each: adding a family starts here.

The rows hold facts, not code. The code that reads them stays where it works: config.json's
defaults in config.py, the weight names in hf_weights.py, the tokenizers in their modules
(text_encoder.py, byte_bpe.py, sentencepiece_text.py), the casing rules in casing.py.
docs/model.md's family table says the same for users.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

WORDPIECE_FILES = ("vocab.txt",)
# The tokenize cache key's part for WordPiece (BertTextEncoder); 2: Hugging Face's
# normalisation (issue 45).
WORDPIECE_ENCODER_VERSION = "bertflow-fastbert-2"
# How a family's tokenizer cases text (Family.casing; tasks/model/casing.py applies it):
# FROM_CHECKPOINT, as the checkpoint's files say (transformers' BertTokenizer lower-cases
# unless they say otherwise); NO_OPTION, it reads text as it is whatever they say; CASED_ONLY,
# it has an option (do_lower_case) and bertflow runs only the cased setting, refusing the other.
CASINGS = FROM_CHECKPOINT, NO_OPTION, CASED_ONLY = ("from checkpoint", "no option", "cased only")


@dataclass(frozen=True)
class Family:
    name: str  # config.json's model_type
    example: str  # a Hub checkpoint, for messages that refuse another family
    # transformers' class stem: Bert -> BertForSequenceClassification, BertForTokenClassification
    architecture: str
    tokenizer_files: tuple[str, ...] = WORDPIECE_FILES  # in the order its text encoder reads them
    # A tokenizer other than WordPiece's BertTextEncoder: (module, class, what its files are).
    text_encoder: Optional[tuple[str, str, str]] = None
    # Part of the tokenize cache key: bump when the family's tokenizer or records change.
    encoder_version: str = WORDPIECE_ENCODER_VERSION
    casing: str = FROM_CHECKPOINT  # one of CASINGS
    # Why the text keeps its case, for NO_OPTION and CASED_ONLY (whose checkpoint does not
    # set the option): the tokenize manifest's lower_case_rule.
    casing_reason: Optional[str] = None
    # Whose encoder, heads and weight names it has (transformers' XLM-R classes are RoBERTa's).
    encoder_family: Optional[str] = None
    weight_prefix: Optional[str] = None  # the encoder's module prefix, where not `name`
    # transformers' (tokenizer, converter) classes for its SentencePiece model file (the export).
    hf_sentencepiece: Optional[tuple[str, str]] = None

    def __post_init__(self):
        if self.casing not in CASINGS:
            raise ValueError(f"{self.name}: casing {self.casing!r} is none of {CASINGS}")
        if (self.casing_reason is None) != (self.casing == FROM_CHECKPOINT):
            raise ValueError(f"{self.name}: casing {self.casing!r} takes a casing_reason "
                             f"unless it is {FROM_CHECKPOINT!r}, and then none")


_SPM_TEXT = "tasks.model.sentencepiece_text"
ROWS = (
    Family("bert", "google-bert/bert-base-uncased", "Bert"),
    Family("distilbert", "distilbert/distilbert-base-uncased", "DistilBert"),
    Family("electra", "google/electra-base-discriminator", "Electra"),
    Family("roberta", "FacebookAI/roberta-base", "Roberta", ("vocab.json", "merges.txt"),
           ("tasks.model.byte_bpe", "RobertaTextEncoder", "byte-level BPE"),
           "bertflow-byte-bpe-1", casing=NO_OPTION,
           casing_reason="byte-level BPE reads text as it is"),
    Family("xlm-roberta", "FacebookAI/xlm-roberta-base", "XLMRoberta",
           ("sentencepiece.bpe.model",),
           (_SPM_TEXT, "XlmRobertaTextEncoder", "SentencePiece model"),
           "bertflow-sentencepiece-1",
           casing=NO_OPTION, casing_reason="its SentencePiece model reads text as it is",
           encoder_family="roberta",
           hf_sentencepiece=("XLMRobertaTokenizer", "XLMRobertaConverter")),
    Family("deberta-v2", "microsoft/deberta-v3-base", "DebertaV2", ("spm.model",),
           (_SPM_TEXT, "DebertaTextEncoder", "SentencePiece model"),
           "bertflow-deberta-spm-1", casing=CASED_ONLY,
           casing_reason=("its SentencePiece model reads text as it is "
                          "(DebertaV2Tokenizer's default)"),
           weight_prefix="deberta",
           hf_sentencepiece=("DebertaV2Tokenizer", "DebertaV2Converter")),
)
FAMILIES = {family.name: family for family in ROWS}
