"""The model's end-of-sequence tokens: what SGLang stops a generation on besides the request's stop ids.

SGLang ends a generation on the ``stop_token_ids`` a request sends AND, whatever the request says, on the
model's own end-of-sequence ids: the tokenizer's ``eos_token``, the ``eos_token_id`` of the checkpoint's
``config.json`` and ``generation_config.json`` (one id or a list), and Llama 3's ``<|eom_id|>`` for a
tokenizer that has it. So a turn can end on a token the chat template never writes (GLM's ``<|endoftext|>``,
Llama's ``<|eom_id|>`` after a tool call). :class:`~slime_strands.chat.ChatRenderer` adds these to the
template's stop tokens: they are sent as stop ids, and a turn's text is stripped of whichever one ended it.

The JSON files are read from the tokenizer's folder (``name_or_path``), or, for a hub id, from the local
Hugging Face cache (never downloaded). A model whose files are elsewhere: put its end-of-sequence ids in the
sampling params' ``stop_token_ids`` (they are stop tokens like these); a turn's text is stripped of the token
the server reports it stopped on in any case.

Closing in place: Llama 3's ``<|eom_id|>`` (end of message: the model called a tool and waits for its result)
ends a turn where the template writes ``<|eot_id|>`` (Meta's prompt format; Llama 3.1's template renders it
there in ipython mode), so the continuation after it does not repeat ``<|eot_id|>``. Any other end-of-sequence
token that ends a turn is followed by the template's own closing token or role tag.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

__all__ = ["ALWAYS_STOP", "CLOSES_IN_PLACE_OF", "end_of_sequence_ids"]

logger = logging.getLogger(__name__)

ALWAYS_STOP = ("<|eom_id|>",)
"""Tokens SGLang stops on for every tokenizer that has them (its ``additional_stop_token_ids``)."""
CLOSES_IN_PLACE_OF = {"<|eom_id|>": "<|eot_id|>"}
"""End tokens that close a turn in place of the template's closing token (see the module doc)."""
_CONFIG_FILES = ("config.json", "generation_config.json")


def end_of_sequence_ids(tokenizer: Any) -> tuple[int, ...]:
    """The model's end-of-sequence token ids (within the tokenizer's vocabulary), in a stable order."""
    vocabulary = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
    ids = [getattr(tokenizer, "eos_token_id", None)]
    ids += [vocabulary[token] for token in ALWAYS_STOP if token in vocabulary]
    ids += _configured_eos_ids(str(getattr(tokenizer, "name_or_path", "") or ""))
    size = len(tokenizer)
    return tuple(
        dict.fromkeys(i for i in ids if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < size)
    )


def _configured_eos_ids(name: str) -> list[int]:
    """``eos_token_id`` of the checkpoint's config files found next to the tokenizer (see the module doc)."""
    ids: list[int] = []
    for filename in _CONFIG_FILES:
        path = _local_file(name, filename)
        if path is None:
            continue
        try:
            with open(path, encoding="utf-8") as f:
                value = json.load(f).get("eos_token_id")
        except (OSError, ValueError, AttributeError) as exc:
            logger.warning("cannot read eos_token_id from %s: %s", path, exc)
            continue
        values = value if isinstance(value, list) else [value]
        ids += [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    return ids


def _local_file(name: str, filename: str) -> str | None:
    """``filename`` of the checkpoint ``name`` on this machine: in its folder, else in the hub cache."""
    if not name:
        return None
    if os.path.isdir(name):
        path = os.path.join(name, filename)
        return path if os.path.isfile(path) else None
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, filename)
    except Exception:  # not a hub id (a path that does not exist), or no huggingface_hub
        return None
    return cached if isinstance(cached, str) else None
