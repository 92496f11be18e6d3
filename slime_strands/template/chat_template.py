"""A tokenizer's chat template and token codec as they are: render a conversation, encode and decode text.

The bottom of the template layer: what every part above needs from the tokenizer, and nothing they find out.
The facts (``facts.py``) are found by rendering with a :class:`ChatTemplate`; the incremental renderer
(``render.py``) adds them to it; the tool-parser probe (``probe.py``) renders through the renderer.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from ..errors import ConfigurationError
from .codec import TokenCodec

__all__ = ["ChatTemplate", "TemplateError", "template_key"]


class TemplateError(ConfigurationError):
    """The tokenizer's chat template cannot be rendered incrementally (or at all) as required."""


class ChatTemplate:
    """The tokenizer's ``apply_chat_template`` with fixed template variables, and its exact token codec."""

    def __init__(self, tokenizer: Any, template_kwargs: Mapping[str, Any]) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no chat template"
            )
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs)
        """Extra template variables (slime's ``apply_chat_template_kwargs``, ``enable_thinking``)."""
        self._codec = TokenCodec.of(tokenizer)
        self._token_texts: dict[int, str] = {}

    def apply(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        generation: bool,
    ) -> str:
        """The tokenizer's ``apply_chat_template`` on ``messages`` as they are (no adapting), with the template
        variables; TemplateError for whatever the template raises."""
        try:
            text = self.tokenizer.apply_chat_template(
                list(messages),
                tools=list(tools) if tools else None,
                tokenize=False,
                add_generation_prompt=generation,
                **self.template_kwargs,
            )
        except Exception as exc:  # jinja errors, template exceptions raised on purpose
            raise TemplateError(f"the chat template failed to render: {exc}") from exc
        if not isinstance(text, str):
            raise TemplateError(f"apply_chat_template returned {type(text).__name__}, expected str")
        return text

    @property
    def special_tokens(self) -> list[str]:
        """Every special / added token, longest first."""
        return self._codec.special_tokens

    def encode_literal(self, text: str) -> list[int]:
        """Token ids of untrusted text: special-token strings in it are split into ordinary tokens."""
        return self._codec.encode_literal(text)

    def encode(self, text: str) -> list[int]:
        """Token ids of already-templated text (special tokens in the text are recognised, none added)."""
        return self._codec.encode(text)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._codec.decode(token_ids)

    def token_text(self, token_id: int) -> str:
        """The text of one token, decoded once (the stop token every continuation starts with is asked for
        every turn)."""
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.decode([token_id])
        return text


def template_key(tokenizer: Any) -> Hashable:
    """The tokenizer's chat template as a cache key: the text, or the items of a dict of named templates."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, Mapping):
        return tuple(sorted((str(name), str(text)) for name, text in template.items()))
    return template
