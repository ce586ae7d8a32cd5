"""The PyTorch side of tests/test_model_parity.py: runs in the torch environment
(tests/torch_env.py; torch and transformers, no TensorFlow, no project code).

    python torch_model_reference.py make OUT MINILM_DIR
        For each family, a tiny random checkpoint OUT/<family> written by transformers'
        *ForSequenceClassification (save_pretrained), and OUT/<family>/reference.npz with its
        last hidden state, pooled output (BERT) and logits on OUT/batch.npz; OUT/minilm.npz
        with BertModel's outputs for the checkpoint in MINILM_DIR; OUT/log_buckets.npz with
        DeBERTa's relative position buckets of distances -1100..1100 for a few settings.
    python torch_model_reference.py load FOLDER...
        AutoModelForSequenceClassification.from_pretrained(FOLDER, output_loading_info=True):
        FOLDER/torch_logits.npy on FOLDER/../batch.npz and FOLDER/loading_info.json.
    python torch_model_reference.py make-token OUT
        The same tiny families written by *ForTokenClassification: OUT/<family> and
        OUT/<family>/reference_logits.npy ([batch, seq, labels]) on OUT/batch.npz.
    python torch_model_reference.py load-token FOLDER...
        As load, with AutoModelForTokenClassification.
A "family" here is a case: "deberta-v3" and "deberta-v2" are two settings of model_type
deberta-v2.
"""
import json
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import (AutoModelForSequenceClassification, AutoModelForTokenClassification,
                          BertConfig, BertForSequenceClassification, BertForTokenClassification,
                          BertModel, DebertaV2Config, DebertaV2ForSequenceClassification,
                          DebertaV2ForTokenClassification, DistilBertConfig,
                          DistilBertForSequenceClassification,
                          DistilBertForTokenClassification, ElectraConfig,
                          ElectraForSequenceClassification, ElectraForTokenClassification,
                          RobertaConfig, RobertaForSequenceClassification,
                          RobertaForTokenClassification, XLMRobertaConfig,
                          XLMRobertaForSequenceClassification,
                          XLMRobertaForTokenClassification)

NUM_LABELS = 3
TINY = dict(vocab_size=99, max_position_embeddings=64, num_labels=NUM_LABELS)
# Each activation bertflow reads once: BERT's exact GELU, DistilBERT's ReLU, ELECTRA's tanh
# GELU (its classification head's GELU is exact whatever the config says).
MODELS = {
    "bert": (BertForSequenceClassification, BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        **TINY)),
    "distilbert": (DistilBertForSequenceClassification, DistilBertConfig(
        dim=32, n_layers=2, n_heads=4, hidden_dim=37, activation="relu", **TINY)),
    "electra": (ElectraForSequenceClassification, ElectraConfig(
        embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, hidden_act="gelu_new", **TINY)),
    # As released RoBERTa configs set it: one token type, positions from pad_token_id + 1.
    "roberta": (RobertaForSequenceClassification, RobertaConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1, **{
            **TINY, "max_position_embeddings": TINY["max_position_embeddings"] + 2})),
    # RoBERTa's modules under XLM-R's classes and model_type (the same `roberta.` names).
    "xlm-roberta": (XLMRobertaForSequenceClassification, XLMRobertaConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1, **{
            **TINY, "max_position_embeddings": TINY["max_position_embeddings"] + 2})),
    # DeBERTa-v3's settings: relative positions only, log buckets (8 buckets, so that the
    # batch's distances up to 8 reach the log range), shared position projections, the
    # relative embeddings LayerNorm'ed, no token types.
    "deberta-v3": (DebertaV2ForSequenceClassification, DebertaV2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        relative_attention=True, position_buckets=8, max_relative_positions=16,
        pos_att_type="p2c|c2p", share_att_key=True, norm_rel_ebd="layer_norm",
        position_biased_input=False, type_vocab_size=0, **TINY)),
    # DeBERTa-v2's other paths: absolute positions too, token types, own position
    # projections, distances clipped at 6 without buckets, a tanh pooler.
    "deberta-v2": (DebertaV2ForSequenceClassification, DebertaV2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        relative_attention=True, max_relative_positions=6, pos_att_type=["c2p", "p2c"],
        position_biased_input=True, type_vocab_size=2, pooler_hidden_act="tanh", **TINY)),
}

TOKEN_CLASSES = {"bert": BertForTokenClassification,
                 "distilbert": DistilBertForTokenClassification,
                 "electra": ElectraForTokenClassification,
                 "roberta": RobertaForTokenClassification,
                 "xlm-roberta": XLMRobertaForTokenClassification,
                 "deberta-v3": DebertaV2ForTokenClassification,
                 "deberta-v2": DebertaV2ForTokenClassification}


def inputs(batch: dict, family: str) -> dict:
    # DistilBERT takes no token types; RoBERTa has one, which transformers fills in.
    names = ["input_ids", "attention_mask"] + (["token_type_ids"]
                                               if family not in ("distilbert", "roberta",
                                                                 "xlm-roberta")
                                               else [])
    return {name: torch.from_numpy(batch[name]).long() for name in names}


@torch.no_grad()
def make(out: Path, minilm_dir: str) -> None:
    batches = np.load(out / "batch.npz")
    batch = {k: batches[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    for family, (cls, config) in MODELS.items():
        torch.manual_seed(0)
        model = cls(config).eval()
        # Off the initial values (LayerNorm 1 and 0, zero biases), so that a swapped or
        # untransposed weight shows.
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
        model.save_pretrained(out / family)
        features = inputs(batch, family)
        encoded = model.base_model(**features)
        reference = {"last_hidden_state": encoded.last_hidden_state.numpy(),
                     "logits": model(**features).logits.numpy()}
        if family == "bert":
            reference["pooler_output"] = encoded.pooler_output.numpy()
        np.savez(out / family / "reference.npz", **reference)

    # transformers' log buckets over distances far beyond the batch's, per bucket setting.
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position
    distances = torch.arange(-1100, 1101)
    np.savez(out / "log_buckets.npz", distances=distances.numpy(), **{
        f"{size}_{top}": make_log_bucket_position(distances, size, top).long().numpy()
        for size, top in ((8, 16), (256, 512), (64, 1024), (32, 100), (512, 2048))})

    minilm = BertModel.from_pretrained(minilm_dir).eval()
    encoded = minilm(**{k[len("minilm_"):]: torch.from_numpy(v).long()
                        for k, v in batches.items() if k.startswith("minilm_")})
    np.savez(out / "minilm.npz", last_hidden_state=encoded.last_hidden_state.numpy(),
             pooler_output=encoded.pooler_output.numpy())


@torch.no_grad()
def make_token(out: Path) -> None:
    batches = np.load(out / "batch.npz")
    for family, (_, config) in MODELS.items():
        torch.manual_seed(0)
        model = TOKEN_CLASSES[family](config).eval()
        for parameter in model.parameters():  # off the initial values, as in make()
            parameter.add_(0.1 * torch.randn_like(parameter))
        model.save_pretrained(out / family)
        logits = model(**inputs({k: batches[k] for k in batches.files}, family)).logits
        np.save(out / family / "reference_logits.npy", logits.numpy())


@torch.no_grad()
def load(folders: list[str], auto=AutoModelForSequenceClassification) -> None:
    for folder in map(Path, folders):
        model, info = auto.from_pretrained(folder, output_loading_info=True)
        model.eval()
        batches = np.load(folder.parent / "batch.npz")
        features = inputs({k: batches[k] for k in batches.files}, model.config.model_type)
        np.save(folder / "torch_logits.npy", model(**features).logits.numpy())
        (folder / "loading_info.json").write_text(json.dumps(
            {key: [str(item) for item in value] for key, value in info.items()}))


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "make":
        make(Path(args[0]), args[1])
    elif command == "make-token":
        make_token(Path(args[0]))
    elif command == "load-token":
        load(args, AutoModelForTokenClassification)
    else:
        load(args)
