"""Tiny random-weight models built on the fly, for tests that must not touch the Hugging Face hub.

Both builders save with ``save_pretrained`` so the code under test loads them through the real
``from_pretrained`` path (config, safetensors weights, fast tokenizer, chat template). The
tokenizer is a byte-level BPE trained in milliseconds with the ``tokenizers`` library, so any
text (including the random text a random-weight model generates) round-trips.

- :func:`build_tiny_reward_model`: a 2-layer Llama ``AutoModelForSequenceClassification``
  (``num_labels=1`` by default). ``pad_is_end_of_turn=True`` reproduces the pitfall of reward
  models such as FsfairX-LLaMA3-RM whose pad token is the end-of-turn token that closes the
  assistant's reply: Hugging Face's own pooling then skips that token and reads the logit one
  position earlier.
- :func:`build_tiny_chat_model`: a 2-layer Llama causal LM with a generation config; generating
  ~16 tokens on CPU takes milliseconds. Usable in-process or by ``transformers serve <path>``,
  which works offline with: ``accelerate`` installed (it always loads with a device map),
  ``--device cpu``, ``HF_HUB_OFFLINE=1``, ``HF_HUB_CACHE`` pointing at an existing directory
  (else ``GET /v1/models`` answers 500), and the request's ``model`` equal to ``<path>``
  (the server is pinned to it).

Session-wide caching without a conftest: :func:`tiny_reward_model_path` and
:func:`tiny_chat_model_path` build once per process (per option set) into a temporary directory
that is removed at exit. Or as pytest fixtures::

    @pytest.fixture(scope="session")
    def tiny_chat_model(tmp_path_factory):
        return build_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat"))

Importing this module imports nothing heavy; torch/transformers/tokenizers load on first build.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "BOS",
    "CHAT_TEMPLATE",
    "END_OF_TURN",
    "PAD",
    "START_OF_TURN",
    "build_tiny_chat_model",
    "build_tiny_reward_model",
    "tiny_chat_model_path",
    "tiny_reward_model_path",
]

BOS = "<|begin|>"
START_OF_TURN = "<|start|>"
END_OF_TURN = "<|eot|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = [PAD, BOS, START_OF_TURN, END_OF_TURN]

# Llama-3 shaped: every turn, the assistant's included, is closed by the end-of-turn token.
CHAT_TEMPLATE = (
    "{{ '" + BOS + "' }}"
    "{% for message in messages %}"
    "{{ '" + START_OF_TURN + "' + message['role'] + '\\n' + message['content'] }}"
    "{{ '" + END_OF_TURN + "' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '" + START_OF_TURN + "assistant\\n' }}{% endif %}"
)

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France? The capital of France is Paris.",
    "Write a short poem about the sea. Waves roll in and out, under a grey sky.",
    "Explain optimal stopping: sample until the expected gain of one more draw is below its cost.",
    "def add(a, b):\n    return a + b\n",
    "Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000, punctuation ,.;:!?()[]{}'\"-_/\\",
    "You are a helpful assistant. Answer concisely and correctly.",
    "user assistant system tool message content role",
]


def _train_tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return tokenizer


def _fast_tokenizer(*, pad_token: str, model_max_length: int, vocab_size: int) -> Any:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(vocab_size),
        bos_token=BOS,
        eos_token=END_OF_TURN,
        pad_token=pad_token,
        model_max_length=model_max_length,
        padding_side="right",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _llama_config(tokenizer: Any, *, max_position_embeddings: int, **extra: Any) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        **extra,
    )


def build_tiny_reward_model(
    path: str | Path,
    *,
    num_labels: int = 1,
    pad_is_end_of_turn: bool = False,
    max_length: int = 512,
    seed: int = 0,
) -> Path:
    """Save a random-weight Llama reward model (sequence classification) and its tokenizer.

    ``pad_is_end_of_turn`` makes the pad token the end-of-turn token (the padding pitfall);
    ``max_length`` is both the tokenizer's ``model_max_length`` and the position limit, so tests
    can provoke truncation with short inputs. Weights are drawn with a larger ``initializer_range``
    than usual so scores spread over O(1) and a wrongly chosen token position is visible.
    """
    import torch
    from transformers import LlamaForSequenceClassification

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = _fast_tokenizer(
        pad_token=END_OF_TURN if pad_is_end_of_turn else PAD,
        model_max_length=max_length,
        vocab_size=384,
    )
    config = _llama_config(
        tokenizer,
        max_position_embeddings=max_length,
        num_labels=num_labels,
        initializer_range=0.2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForSequenceClassification(config).eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build_tiny_chat_model(path: str | Path, *, max_new_tokens: int = 16, seed: int = 0) -> Path:
    """Save a random-weight Llama causal LM, its tokenizer, chat template and generation config.

    The generation config samples (``do_sample=True``) and stops at the end-of-turn token, like a
    real chat model; ``max_new_tokens`` is the default length when a request gives none.
    """
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = _fast_tokenizer(pad_token=PAD, model_max_length=1024, vocab_size=384)
    config = _llama_config(tokenizer, max_position_embeddings=1024)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        max_new_tokens=max_new_tokens,
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


_CACHE: dict[tuple[str, tuple[tuple[str, Any], ...]], Path] = {}


def _cached(kind: str, builder: Any, options: dict[str, Any]) -> Path:
    key = (kind, tuple(sorted(options.items())))
    if key not in _CACHE:
        directory = tempfile.mkdtemp(prefix=f"pandora-tiny-{kind}-")
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        _CACHE[key] = builder(Path(directory), **options)
    return _CACHE[key]


def tiny_reward_model_path(**options: Any) -> Path:
    """:func:`build_tiny_reward_model`, built once per process per option set."""
    return _cached("reward", build_tiny_reward_model, options)


def tiny_chat_model_path(**options: Any) -> Path:
    """:func:`build_tiny_chat_model`, built once per process per option set."""
    return _cached("chat", build_tiny_chat_model, options)
