"""Tiny RANDOM-weight models for the offline demo (``pandora serve --demo-tiny-models``).

They let the whole stack (gateway, in-process generation, reward scoring, stopping) run end to
end on a machine without Hugging Face hub access. They produce random text and random rewards:
a smoke test of the plumbing, not of quality. Built once (well under a second) into
``~/.cache/pandora/demo-models`` (``PANDORA_DEMO_DIR`` overrides).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["demo_model_paths"]

_SPECIAL = ["<|pad|>", "<|begin|>", "<|start|>", "<|eot|>"]
_TEMPLATE = (
    "{{ '<|begin|>' }}{% for m in messages %}{{ '<|start|>' + m['role'] + '\\n' + m['content']"
    " + '<|eot|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start|>assistant\\n' }}"
    "{% endif %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. What is the capital of France? Paris.",
    "Optimal stopping: keep sampling while one more draw is worth its cost.",
    "0 1 2 3 4 5 6 7 8 9 , . ; : ! ? ( ) [ ] { } ' \" - _ / user assistant system",
]


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=_SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token="<|begin|>",
        eos_token="<|eot|>",
        pad_token="<|pad|>",
        model_max_length=1024,
    )
    tokenizer.chat_template = _TEMPLATE
    return tokenizer


def _config(tokenizer: Any, **extra: Any) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **extra,
    )


def _build(root: Path) -> None:
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM, LlamaForSequenceClassification

    tokenizer = _tokenizer()
    torch.manual_seed(0)
    chat = LlamaForCausalLM(_config(tokenizer)).eval()
    chat.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        max_new_tokens=32,
    )
    chat.save_pretrained(root / "chat")
    tokenizer.save_pretrained(root / "chat")
    reward = LlamaForSequenceClassification(
        _config(tokenizer, num_labels=1, initializer_range=0.2)
    ).eval()
    reward.save_pretrained(root / "reward")
    tokenizer.save_pretrained(root / "reward")
    (root / "READY").write_text("random-weight demo models; they generate random text\n")


def demo_model_paths() -> tuple[Path, Path]:
    """(chat model dir, reward model dir), built on first use."""
    root = Path(os.environ.get("PANDORA_DEMO_DIR", Path.home() / ".cache/pandora/demo-models"))
    if not (root / "READY").exists():
        root.mkdir(parents=True, exist_ok=True)
        _build(root)
    return root / "chat", root / "reward"
