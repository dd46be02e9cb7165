"""Score (prompt, response) pairs with a sequence-classification reward model, batch-invariantly.

The score of a response is the raw logit (no sigmoid) of the model's single label, read at the
last token the reward model's own chat template produces for ``[*prompt messages, assistant
response]`` (no generation prompt): for Llama-3 style templates that is the end-of-turn token that
closes the assistant's reply.

The padding pitfall: Hugging Face's ``*ForSequenceClassification`` pools at "the rightmost token
that is not the pad id". When a model's pad token *is* its end-of-turn token (FsfairX-LLaMA3-RM,
several Skywork checkpoints), that rule silently skips the closing token and reads one position
earlier, and older releases read before the *first* end-of-turn, i.e. inside the prompt. We never
let the pad id choose the position: sequences are right-padded (real tokens keep positions
``0..n-1`` exactly as when scored alone; causal attention keeps pads out of them), the base model
returns hidden states, and the head is applied to the hidden state at index ``n - 1`` of each
sequence. Batched scores therefore equal one-at-a-time scores (tests pin this in fp32 at 1e-4).
Architectures without a ``score`` head (encoder models pooling a CLS token, custom heads) are
scored one sequence per forward pass, which is exact whatever their pooling does.

Shared prefixes: sequences of a batch that begin with the same tokens (a request's candidates
share their prompt) are scored by running the prefix once and the remaining tokens of each
against its key/value cache (:mod:`reward.prefix_groups` plans the groups). Used only where a
probe at load shows it gives one-at-a-time scores on this model, like the padding probe.

This module imports torch; import it only where a model runs (worker, in-process backend).
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from reward.prefix_groups import common_prefix_length, plan_prefix_groups

__all__ = ["EncodedPair", "RewardScorer", "flatten_content", "resolve_device", "resolve_dtype"]

logger = logging.getLogger(__name__)

# A tokenizer's model_max_length above this means "unset" (transformers stores 1e30 for that).
_UNSET_LENGTH = 10**8

# Stands in for the reply in a request's one template render (RewardScorer._render): edge
# whitespace, think tags, quotes, a backslash and markup, all of which a template that transforms
# replies (trim, reasoning split, escaping, tojson) would not leave verbatim.
_SENTINEL = ' \n<think>\n"pandora\'s \\ reply" & <b>{x}</b>\n</think>\n\t '


@dataclass(frozen=True, slots=True)
class EncodedPair:
    """Token ids of one templated (prompt, response) pair, after truncation."""

    ids: list[int]
    truncated: bool


def flatten_content(content: Any) -> str:
    """OpenAI message content as plain text: a string, or the text parts of a parts list joined.

    Reward-model chat templates expect a string; non-text parts (images, audio) cannot be scored
    by a text reward model and are refused rather than silently dropped.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise ValueError(f"message content part of type {kind!r} cannot be scored")
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise ValueError(f"message content must be a string or a list of parts, not {content!r}")


def resolve_device(device: str) -> torch.device:
    """``auto`` picks CUDA when available, else CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 (or float16) on a GPU, float32 on CPU where half precision is slow."""
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    resolved = getattr(torch, dtype, None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use auto, bfloat16, float16 or float32")
    return resolved


class RewardScorer:
    """A loaded reward model: ``encode`` turns a pair into ids, ``forward`` scores a batch of ids.

    ``forward`` is synchronous and not thread-safe; the batcher calls it from one thread.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str,
        label_index: int | None = None,
        max_length: int | None = None,
        torch_threads: int | None = None,
        prefix_sharing: bool = True,
    ) -> None:
        num_labels = int(model.config.num_labels)
        if label_index is None:
            if num_labels != 1:
                labels = getattr(model.config, "id2label", None) or {}
                raise ValueError(
                    f"{name} has {num_labels} labels ({', '.join(map(str, labels.values()))}); "
                    "a reward model has one — pass --label-index to pick the reward logit"
                )
            label_index = 0
        elif not 0 <= label_index < num_labels:
            raise ValueError(f"--label-index {label_index} is out of range for {num_labels} labels")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"{name}'s tokenizer has no chat template; cannot format a dialogue")
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.label_index = label_index
        self.max_length = max_length or _model_max_length(model, tokenizer)
        self.device = next(model.parameters()).device
        # torch's CPU thread count is per calling thread, so it is applied where forward runs.
        # On an oversubscribed CPU one thread is far faster for small models (ops stop waiting
        # on descheduled threads): ~15x on our shared 2-core test machine.
        self.torch_threads = torch_threads
        self._splice_replies = True  # until the chat template shows it transforms replies
        self._pad_id = _padding_id(tokenizer)
        head = getattr(model, "score", None)
        self._head = head if isinstance(head, torch.nn.Module) else None
        self._base = getattr(model, getattr(model, "base_model_prefix", ""), None)
        if self._head is None or self._base is None:
            logger.warning(
                "%s has no `score` head on a base model; scoring one sequence per forward pass",
                name,
            )
        if model.config.pad_token_id is None:
            # Only silences transformers' "no padding token" refusal: we pick positions ourselves.
            model.config.pad_token_id = self._pad_id
        if getattr(model.config, "use_cache", False):
            model.config.use_cache = False  # one pass per sequence: a KV cache is pure overhead
        # Whether right padding needs no attention mask (checked on the model, see below).
        self._padding_is_invisible = self._probe_padding_is_invisible()
        # The keyword a cached pass takes (``cache`` in transformers 5, ``past_key_values`` before)
        self._cache_keyword = _cache_keyword(self._base)
        self.prefix_sharing = prefix_sharing and self._probe_prefix_sharing()
        self.shared_prefix_tokens = 0  # token positions shared prefixes saved so far

    @classmethod
    def from_pretrained(
        cls,
        model: str,
        *,
        device: str = "auto",
        dtype: str = "auto",
        label_index: int | None = None,
        max_length: int | None = None,
        torch_threads: int | None = None,
        prefix_sharing: bool = True,
    ) -> RewardScorer:
        """Load from a local directory or a hub id (cached or downloadable)."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        target = resolve_device(device)
        torch_dtype = resolve_dtype(dtype, target)
        use_flash = target.type == "cuda" and importlib.util.find_spec("flash_attn") is not None
        tokenizer = AutoTokenizer.from_pretrained(model)
        network = AutoModelForSequenceClassification.from_pretrained(
            model,
            dtype=torch_dtype,
            attn_implementation="flash_attention_2" if use_flash else "sdpa",
        )
        network.to(target).eval()
        return cls(
            network,
            tokenizer,
            name=model,
            label_index=label_index,
            max_length=max_length,
            torch_threads=torch_threads,
            prefix_sharing=prefix_sharing,
        )

    # -- encoding -------------------------------------------------------------------------------

    def encode(self, messages: Sequence[Mapping[str, Any]], response: str) -> EncodedPair:
        """Apply the chat template to the dialogue ending in ``response`` and tokenize it.

        Over-long pairs keep their end (the response and the closing token are what is scored) and
        the leading BOS token, dropping the oldest prompt tokens; ``truncated`` records it.
        """
        return self.encode_many([(messages, response)])[0]

    def encode_many(
        self, pairs: Sequence[tuple[Sequence[Mapping[str, Any]], str]]
    ) -> list[EncodedPair]:
        """:meth:`encode` for many (messages, response) pairs, with one tokenizer call per batch.

        The fast tokenizer encodes a list of texts in one call (in Rust, without a Python round
        trip per text), which is where batching the encoding saves time. Consecutive pairs that
        share one ``messages`` object (a request's responses) are templated together (see
        :meth:`_render`); every text equals its own template render and is truncated exactly as
        :meth:`encode` does alone, so the ids are the same.
        """
        texts: list[str] = []
        start = 0
        while start < len(pairs):
            messages, end = pairs[start][0], start + 1
            while end < len(pairs) and pairs[end][0] is messages:
                end += 1
            texts += self._render(messages, [response for _, response in pairs[start:end]])
            start = end
        bos = self.tokenizer.bos_token
        # templates usually write BOS themselves; add special tokens only where they do not
        add_special = [not (bos and text.startswith(bos)) for text in texts]
        ids: list[list[int]] = [[] for _ in texts]
        for flag in (True, False):
            rows = [row for row, wanted in enumerate(add_special) if wanted is flag]
            if not rows:
                continue
            encoded = self.tokenizer([texts[row] for row in rows], add_special_tokens=flag)
            for row, row_ids in zip(rows, encoded["input_ids"], strict=True):
                ids[row] = list(row_ids)
        return [self._truncate(row_ids) for row_ids in ids]

    def _render(self, messages: Sequence[Mapping[str, Any]], responses: list[str]) -> list[str]:
        """Chat-template texts of one prompt's responses, in two renders rather than one each.

        The dialogue is rendered once with a sentinel reply and split around it; each response is
        spliced in. That is exact only for a template that inserts the reply verbatim, so: the
        sentinel carries what templates commonly transform (edge whitespace for ``trim``, think
        tags for reasoning splits, quotes, backslashes and markup for escaping and ``tojson``) and
        must come out verbatim, exactly once; the first response is rendered directly and must
        equal its splice; empty responses are rendered directly. Any failure renders this request
        pair by pair and turns splicing off for this scorer for good. Below three responses a
        splice saves nothing.
        """
        dialogue = [
            {**message, "content": flatten_content(message.get("content"))} for message in messages
        ]
        first = self._apply_template(dialogue, responses[0])
        if len(responses) < 3 or not self._splice_replies:
            return [first] + [self._apply_template(dialogue, reply) for reply in responses[1:]]
        head, found, tail = self._apply_template(dialogue, _SENTINEL).partition(_SENTINEL)
        if not found or _SENTINEL in tail or head + responses[0] + tail != first:
            self._splice_replies = False
            logger.info(
                "%s's chat template does not insert replies verbatim: no splicing", self.name
            )
            return [first] + [self._apply_template(dialogue, reply) for reply in responses[1:]]
        return [first] + [
            head + reply + tail if reply else self._apply_template(dialogue, reply)
            for reply in responses[1:]
        ]

    def _template(self, messages: Sequence[Mapping[str, Any]], response: str) -> str:
        """The template render of one pair (the reference :meth:`_render` must reproduce)."""
        dialogue = [
            {**message, "content": flatten_content(message.get("content"))} for message in messages
        ]
        return self._apply_template(dialogue, response)

    def _apply_template(self, dialogue: list[dict[str, Any]], response: str) -> str:
        return self.tokenizer.apply_chat_template(
            [*dialogue, {"role": "assistant", "content": response}],
            tokenize=False,
            add_generation_prompt=False,
        )

    def _truncate(self, ids: list[int]) -> EncodedPair:
        if len(ids) <= self.max_length:
            return EncodedPair(ids, truncated=False)
        head = ids[:1] if ids[0] == self.tokenizer.bos_token_id else []
        tail = ids[len(ids) - (self.max_length - len(head)) :]
        return EncodedPair(head + tail, truncated=True)

    # -- scoring --------------------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, batch: Sequence[Sequence[int]]) -> list[float]:
        """Raw reward logits for a batch of token-id sequences, in input order."""
        if not batch:
            return []
        self._use_torch_threads()
        if self._head is None or self._base is None:
            return [self._forward_padded([ids])[0] for ids in batch]
        if self.prefix_sharing and len(batch) > 1:
            plan = plan_prefix_groups(batch)
            if plan.groups:
                scores = [0.0] * len(batch)
                try:
                    for group in plan.groups:
                        members = [batch[index] for index in group.members]
                        shared = self._forward_shared(members, group.prefix_length)
                        for index, score in zip(group.members, shared, strict=True):
                            scores[index] = score
                except FloatingPointError:
                    raise  # the model's own scores, not the shared path, are at fault
                except Exception:
                    # The probe passed on short inputs; whatever this batch hit (a cache the
                    # device cannot hold, a length the cached path cannot take), plain passes
                    # score it, and every batch after it.
                    logger.exception("%s: shared-prefix pass failed; sharing turned off", self.name)
                    self.prefix_sharing = False
                    return self._forward_padded(batch)
                if plan.rest:
                    plain = self._forward_padded([batch[index] for index in plan.rest])
                    for index, score in zip(plan.rest, plain, strict=True):
                        scores[index] = score
                self.shared_prefix_tokens += plan.saved_tokens
                return scores
        return self._forward_padded(batch)

    def _use_torch_threads(self) -> None:
        """Apply ``torch_threads`` here: torch's CPU thread count is set per calling thread."""
        if self.torch_threads and torch.get_num_threads() != self.torch_threads:
            torch.set_num_threads(self.torch_threads)

    def _forward_padded(self, batch: Sequence[Sequence[int]]) -> list[float]:
        lengths = [len(ids) for ids in batch]
        if min(lengths) == 0:
            raise ValueError("cannot score an empty token sequence")
        width = max(lengths)
        pad = [self._pad_id]
        input_ids = torch.tensor(
            [list(ids) + pad * (width - len(ids)) for ids in batch], device=self.device
        )
        last = torch.tensor(lengths, device=self.device) - 1
        if self._head is None or self._base is None:
            attention_mask = torch.arange(width, device=self.device) <= last[:, None]
            logits = self.model(input_ids=input_ids, attention_mask=attention_mask.long()).logits
        else:
            hidden = self._hidden_states(input_ids, last)
            logits = self._head(hidden[torch.arange(len(batch), device=self.device), last])
        return self._scores(logits)

    def _forward_shared(self, batch: Sequence[Sequence[int]], prefix_length: int) -> list[float]:
        """Scores of sequences whose first ``prefix_length`` tokens are identical: one pass of the
        prefix with a key/value cache, repeated for each sequence, then one right-padded pass of
        the remaining tokens against it (positions continue from the prefix; causal attention
        keeps the padding out, as in :meth:`_hidden_states`). Unlike a plain pass it holds the
        group's key/value cache, (members x (prefix + suffix)) token positions per layer, which
        the batcher's ``max_batch_tokens`` bounds as it bounds a plain pass's padded tokens."""
        assert self._base is not None and self._head is not None and self._cache_keyword
        prefix = torch.tensor([list(batch[0][:prefix_length])], device=self.device)
        output = self._base(input_ids=prefix, use_cache=True)
        cache = getattr(output, "cache", None) or getattr(output, "past_key_values", None)
        if cache is None:
            raise RuntimeError(f"{self.name} returned no key/value cache for a prefix pass")
        cache.batch_repeat_interleave(len(batch))
        suffixes = [list(ids[prefix_length:]) for ids in batch]
        width = max(len(ids) for ids in suffixes)
        input_ids = torch.tensor(
            [ids + [self._pad_id] * (width - len(ids)) for ids in suffixes], device=self.device
        )
        last = torch.tensor([len(ids) - 1 for ids in suffixes], device=self.device)
        hidden = self._base(
            input_ids=input_ids, use_cache=False, **{self._cache_keyword: cache}
        ).last_hidden_state
        return self._scores(self._head(hidden[torch.arange(len(batch), device=self.device), last]))

    def _scores(self, logits: torch.Tensor) -> list[float]:
        scores = logits[:, self.label_index].float().cpu().tolist()
        bad = [score for score in scores if not math.isfinite(score)]
        if bad:
            raise FloatingPointError(f"reward model produced non-finite scores {bad[:3]}")
        return scores

    def _hidden_states(self, input_ids: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """The base model's last hidden states for right-padded ``input_ids``.

        With causal attention a token never sees the tokens after it, so right padding cannot
        reach the real tokens and no padding mask is needed: without one, attention takes the
        plain causal kernel instead of building and applying a per-batch mask (~30% of a
        batched forward pass of a small model on CPU). Only where the probe at load showed it.
        """
        if self._padding_is_invisible:
            return self._base(input_ids=input_ids).last_hidden_state
        width = input_ids.shape[1]
        attention_mask = torch.arange(width, device=self.device) <= last[:, None]
        return self._base(
            input_ids=input_ids, attention_mask=attention_mask.long()
        ).last_hidden_state

    @torch.inference_mode()
    def _probe_padding_is_invisible(self) -> bool:
        """Whether tokens appended after a sequence leave its last hidden state unchanged when no
        attention mask is given, i.e. the model attends causally.

        Checked on the loaded model rather than trusted from its architecture: the sequence alone
        (mask of ones, as when it is scored alone) against the same sequence followed by other
        tokens and no mask. A bidirectional model fails it and keeps its padding mask.
        """
        if self._head is None or self._base is None:
            return False
        try:
            ids = self.encode([{"role": "user", "content": "Is 2 + 2 = 4?"}], "Yes, it is 4.").ids
        except Exception:  # a template that refuses a plain dialogue: do not guess
            return False
        self._use_torch_threads()
        alone = torch.tensor([ids], device=self.device)
        followed = torch.tensor([ids + ids[::-1]], device=self.device)
        reference = self._base(input_ids=alone, attention_mask=torch.ones_like(alone))
        reference = reference.last_hidden_state[0, len(ids) - 1].float()
        unmasked = self._base(input_ids=followed).last_hidden_state[0, len(ids) - 1].float()
        dtype = next(self.model.parameters()).dtype
        tolerance = 1e-4 if dtype == torch.float32 else 2e-2
        drift = float((unmasked - reference).norm() / reference.norm().clamp_min(1e-12))
        return drift <= tolerance

    @torch.inference_mode()
    def _probe_prefix_sharing(self) -> bool:
        """Whether a shared-prefix pass gives this model's one-at-a-time scores.

        Needs causal attention (the padding probe) and a cached pass; then three responses of
        very different lengths to one prompt are scored both ways. Anything else (an
        architecture whose cache cannot be repeated, a position scheme that does not continue
        from a cache) leaves sharing off rather than risking a wrong score.
        """
        if not (self._padding_is_invisible and self._cache_keyword):
            return False
        prompt = [{"role": "user", "content": "Name a colour of the sky, and explain it."}]
        replies = ["Blue.", "Blue, because air scatters short wavelengths more.", "Grey " * 12]
        try:
            batch = [pair.ids for pair in self.encode_many([(prompt, r) for r in replies])]
            shared = min(len(ids) for ids in batch) - 1
            for ids in batch[1:]:
                shared = min(shared, common_prefix_length(batch[0], ids))
            self._use_torch_threads()
            alone = [self._forward_padded([ids])[0] for ids in batch]
            cached = self._forward_shared(batch, shared)
        except Exception as exc:  # an architecture without a repeatable cache, say
            logger.info("%s: no shared-prefix scoring (%s)", self.name, exc)
            return False
        dtype = next(self.model.parameters()).dtype
        tolerance = 1e-4 if dtype == torch.float32 else 2e-2
        scale = max(1.0, *(abs(score) for score in alone))
        exact = all(abs(a - b) <= tolerance * scale for a, b in zip(alone, cached, strict=True))
        if not exact:
            logger.info("%s: shared-prefix scores differ from one-at-a-time ones", self.name)
        return exact


def _cache_keyword(base: Any) -> str | None:
    """The keyword ``base.forward`` takes a key/value cache by, if any."""
    if base is None:
        return None
    try:
        parameters = inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return None
    return next((name for name in ("cache", "past_key_values") if name in parameters), None)


def _padding_id(tokenizer: Any) -> int:
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id):
        if candidate is not None:
            return int(candidate)
    return 0


def _model_max_length(model: Any, tokenizer: Any) -> int:
    limits = [int(tokenizer.model_max_length)] if tokenizer.model_max_length else []
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions:
        limits.append(int(positions))
    limits = [limit for limit in limits if 0 < limit < _UNSET_LENGTH]
    return min(limits) if limits else 4096
