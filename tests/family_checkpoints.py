"""Tiny random checkpoints (2 layers, hidden 32) of the families whose tokenizer is not
WordPiece, and of a cased BERT, each beside a vocabulary trained here, written by bertflow's
own save (tasks/model/hf_weights.py, whose keys tests/test_model_parity.py checks against
PyTorch's): what the steps tests (test_roberta_steps.py, test_xlm_roberta_steps.py,
test_deberta_steps.py, test_casing.py) and the whole-DAG tests (test_dag_families.py,
test_dag_tokens.py) fine-tune; and (tiny_default_vocab) of any family over the default
checkpoint's vocabulary."""
from __future__ import annotations

import io
import json
from pathlib import Path

_TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 64}


def _save(folder: Path, raw: dict) -> Path:
    from tasks.model.random_checkpoint import save_random_classifier

    return save_random_classifier(raw, 0, ["a", "b"], folder)


def tiny_roberta(folder: Path, extra: tuple[str, ...] = (), vocab_size: int = 600) -> Path:
    """A RoBERTa on a byte-level BPE trained on test_byte_bpe's texts and `extra`."""
    from tasks.model.byte_bpe import read_vocab
    from test_byte_bpe import train_byte_bpe

    vocab, _ = train_byte_bpe(folder, extra=extra, vocab_size=vocab_size)
    return _save(folder, {
        "model_type": "roberta", "vocab_size": len(read_vocab(vocab)), **_TINY,
        "max_position_embeddings": 66, "type_vocab_size": 1, "layer_norm_eps": 1e-5,
        "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2})


def tiny_xlm_roberta(folder: Path) -> Path:
    """An XLM-R on a unigram SentencePiece model with XLM-R's normalizer
    (test_sentencepiece_text.py), fairseq's ids."""
    from tasks.model.sentencepiece_model import FAIRSEQ, read_model
    from test_sentencepiece_text import train_sentencepiece

    _, model = read_model(train_sentencepiece(folder))
    return _save(folder, {
        "model_type": "xlm-roberta", "vocab_size": FAIRSEQ.vocab_size(model), **_TINY,
        "max_position_embeddings": 66, "type_vocab_size": 1, "layer_norm_eps": 1e-5,
        "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2})


DEBERTA_SPM = "spm.model"


def train_deberta_spm(folder: Path) -> Path:
    """A tiny unigram model (`folder`/spm.model) with DeBERTa-v3's first pieces, [PAD] [CLS]
    [SEP] [UNK] at 0-3, as microsoft/deberta-v3-base's spm.model has them ([MASK] is not a
    piece there: transformers adds it after the last piece)."""
    import pytest

    from test_byte_bpe import TRAINING
    from test_sentencepiece_text import MULTILINGUAL

    spm = pytest.importorskip("sentencepiece")  # skips only the tests that build one
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TRAINING + MULTILINGUAL * 20), model_writer=model,
        model_type="unigram", vocab_size=500, hard_vocab_limit=False, character_coverage=1.0,
        pad_id=0, bos_id=1, eos_id=2, unk_id=3, pad_piece="[PAD]", bos_piece="[CLS]",
        eos_piece="[SEP]", unk_piece="[UNK]", num_threads=1, minloglevel=2)
    (folder / DEBERTA_SPM).write_bytes(model.getvalue())
    return folder / DEBERTA_SPM


def tiny_deberta(folder: Path) -> Path:
    """A DeBERTa-v3: relative attention, shared position buckets, no absolute positions and
    no token types (microsoft/deberta-v3-base's config, scaled down), on a unigram model with
    v3's first pieces (train_deberta_spm); its embedding has more rows than the model has
    pieces, as v3's 128100 for 128000."""
    from tasks.model.sentencepiece_model import read_model

    _, model = read_model(train_deberta_spm(folder))
    _save(folder, {
        "model_type": "deberta-v2", "vocab_size": len(model.pieces) + 100, **_TINY,
        "max_position_embeddings": 64, "type_vocab_size": 0, "relative_attention": True,
        "position_buckets": 16, "norm_rel_ebd": "layer_norm", "share_att_key": True,
        "pos_att_type": ["p2c", "c2p"], "position_biased_input": False,
        "layer_norm_eps": 1e-7, "max_relative_positions": -1, "pad_token_id": 0})
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    return folder


CASED_CORPUS = [
    "The Quick Brown Fox jumps over Zoë's café in São Paulo.",
    "Müller sagte: die Straße ist NASS!",
    "東京は日本の首都です。北京也是首都。",
    "I love it 😀🎉 so MUCH, said Ana.",
    "NASA and the E.U. agreed; a naïve résumé from Émile.",
    "ÉCOLE École école, Ωmega and ωmega",
    "New York's MoMA opened at 9am; Dr. Smith-Jones arrived late.",
]


def cased_vocab(out: Path) -> Path:
    """A cased WordPiece vocabulary (vocab.txt in `out`) on CASED_CORPUS and the
    token-classification sentences' words (train_helpers.tagged_sentences)."""
    from tokenizers import BertWordPieceTokenizer

    from train_helpers import FILLER, NAMES, PLACES, SERVED

    trainer = BertWordPieceTokenizer(lowercase=False, strip_accents=False, clean_text=True,
                                     handle_chinese_chars=True)
    words = [" ".join(NAMES), " ".join(w for place in PLACES for w in place), " ".join(FILLER)]
    trainer.train_from_iterator((CASED_CORPUS + words + SERVED) * 20, vocab_size=700,
                                min_frequency=1,
                                special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    trainer.save_model(str(out))
    return out / "vocab.txt"


def tiny_cased_bert(folder: Path, vocab: Path | None = None) -> Path:
    """A BERT with a cased vocabulary (`vocab`, else `cased_vocab`'s) and transformers'
    tokenizer files saying do_lower_case false, as bert-base-cased has them."""
    import shutil

    import transformers

    from train_helpers import write_tiny_model

    if vocab is None:  # beside the folder: write_tiny_model writes its own vocab.txt there
        (apart := folder.parent / f"{folder.name}-vocab").mkdir(parents=True)
        vocab = cased_vocab(apart)
    write_tiny_model(folder, vocab_size=len(vocab.read_text().splitlines()))
    shutil.copy(vocab, folder / "vocab.txt")
    transformers.BertTokenizer(vocab=str(folder / "vocab.txt"),
                               do_lower_case=False).save_pretrained(folder)
    return folder


def tiny_default_vocab(folder: Path, family: str = "bert", **config) -> Path:
    """A tiny `family` (train_helpers.write_tiny_model, `config` its config.json's) over the
    default checkpoint's uncased vocabulary: real words tokenize as for a pretrained one."""
    import shutil

    from tasks.training.checkpoint_sources import default_base_model_dir
    from train_helpers import write_tiny_model

    vocab = default_base_model_dir() / "vocab.txt"
    write_tiny_model(folder, family, vocab_size=len(vocab.read_text().splitlines()),
                     max_position_embeddings=64, **config)
    shutil.copy(vocab, folder / "vocab.txt")  # over write_tiny_model's own
    return folder


BUILDERS = {"bert-cased": tiny_cased_bert, "roberta": tiny_roberta, "xlm-roberta": tiny_xlm_roberta,
            "deberta-v2": tiny_deberta}
