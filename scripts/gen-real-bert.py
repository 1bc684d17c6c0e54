"""Adds bert_tiny to tests/fixtures/real (and its real_manifest.json entry):
transformers' BertForSequenceClassification, tiny, through gen_real.py's
protocol (state, inputs, eval and train outputs, loss, every gradient, the
state after one SGD step). Run from the repository root with a Python that
has torch, transformers and safetensors:
    /opt/torchvenv/bin/python scripts/gen-real-bert.py
"""
import os
import sys

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REAL = os.path.join(ROOT, "tests", "fixtures", "real")
sys.path.insert(0, REAL)
import gen_real  # noqa: E402  (its build/main: the protocol every real fixture shares)


def bert_tiny():
    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=32, type_vocab_size=2,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3,
                     attn_implementation="eager")
    m = BertForSequenceClassification(cfg)
    g = torch.Generator().manual_seed(10)
    ids = torch.randint(1, 128, (2, 12), generator=g)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 8:] = 0  # the second sequence is 8 tokens, padded
    ids[1, 8:] = cfg.pad_token_id
    types = torch.zeros(2, 12, dtype=torch.long)
    types[:, 6:] = 1  # two segments
    types[1, 8:] = 0
    y = torch.tensor([2, 0])
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    fwd = lambda m, i: m(input_ids=i["input_ids"], attention_mask=i["attention_mask"],
                         token_type_ids=i["token_type_ids"]).logits
    return m, inputs, fwd, lambda out: F.cross_entropy(out, y), "cross_entropy(logits, [2, 0])", \
        "transformers BertForSequenceClassification(vocab 128, hidden 32, 2 layers, 4 heads, intermediate 64, " \
        "max_position_embeddings 32, num_labels 3), attention mask and token_type_ids"


if __name__ == "__main__":
    gen_real.MODELS["bert_tiny"] = bert_tiny
    sys.argv = [sys.argv[0], REAL, "bert_tiny"]
    gen_real.main()
