"""Tiny Hugging Face models the tests build and save themselves (no download): a word-level
tokenizer over a few es/pt/en words and a one-layer BERT or Llama with random weights."""
from __future__ import annotations

from pathlib import Path

WORDS = ("el la de que y a en un ser se no los las por con una para es the of and to in is that it for "
         "was on are with as o os da do em um uma para com não se na no ao").split()


def tiny_tokenizer(max_length: int = 64, chat_template: str | None = None):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    vocab = {w: i for i, w in enumerate(dict.fromkeys([*specials, *WORDS, *"0123456789", "score", ":"]))}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.normalizer = normalizers.Lowercase()
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.post_processor = TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]", eos_token="[SEP]", model_max_length=max_length)
    if chat_template:
        fast.chat_template = chat_template
    return fast


def tiny_bert(folder: Path, num_labels: int = 1, id2label: dict | None = None, seed: int = 0) -> Path:
    """A one-layer BERT sequence classifier with weights large enough that documents score apart."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification
    tok = tiny_tokenizer()
    torch.manual_seed(seed)
    kw = {"id2label": id2label, "label2id": {v: k for k, v in id2label.items()}} if id2label else {}
    cfg = BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=64, num_labels=num_labels,
                     initializer_range=0.5, **kw)
    model = BertForSequenceClassification(cfg)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return Path(folder)
