"""``slime-strands check-template``: everything token-in/token-out needs from a tokenizer, as a report.

The facts and the checks are the template layer's (``template/facts.py``, ``render.py``, ``probe.py``); this
module only runs them without raising and says what they found, per thinking mode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigurationError
from ..template.probe import TemplateError, detect_tool_parser, rendered_call_turn, tool_problems, why_unread
from ..template.render import ChatRenderer
from ..tool_parsers import AUTO, get_tool_parser

__all__ = ["TemplateReport", "check_template"]


@dataclass(frozen=True)
class TemplateReport:
    """What ``slime-strands check-template`` prints for one tokenizer and thinking mode."""

    tokenizer: str
    enable_thinking: bool | None
    tito_safe: bool
    reason: str | None = None
    """Why token-in/token-out is not safe (the template error), when it is not."""
    parser: str | None = None
    family: str | None = None
    parser_evidence: str | None = None
    turn_end: str | None = None
    stop_tokens: Sequence[str] = field(default_factory=tuple)
    generation_prompt: str | None = None
    arguments_as: str | None = None
    tool_role: str | None = None
    parallel_calls: bool | None = None
    parser_problem: str | None = None
    """Why the parser set by name cannot read what the template renders (None: it can, or it was detected)."""
    end_tokens: Sequence[str] = field(default_factory=tuple)
    """The model's end-of-sequence tokens that also end a turn (``render.end_of_sequence_ids``)."""
    dropped_prompt: str = ""
    """What the template's generation prompt adds that its rendering of the next turn does not start with."""
    rewrites: Sequence[tuple[str, str]] = field(default_factory=tuple)
    """What the template renders differently once later messages follow (as shown, as later rendered)."""
    tools: Sequence[str] = field(default_factory=tuple)
    """The names of the agent's tools (a settings file's Python and MCP tools) the probe offered."""
    tool_problems: Sequence[str] = field(default_factory=tuple)
    """Per tool, what keeps it from working with the template (not shown, its call not read back)."""

    @property
    def usable(self) -> bool:
        """Token-in/token-out is safe AND a tool parser is known that reads the template's tool calls (the
        agent's tools' too, when they were given)."""
        return (
            self.tito_safe
            and self.parser is not None
            and self.parser_problem is None
            and not self.tool_problems
        )

    def lines(self) -> list[str]:
        head = f"enable_thinking={self.enable_thinking}"
        if self.turn_end is None:
            return [f"{head}: NOT usable token-in/token-out: {self.reason}"]
        out = [f"{head}: {'ok' if self.usable else 'NOT usable'}"]
        out.append(f"  family: {self.family or 'unknown'}")
        out.append(f"  tool parser: {self.parser or 'none'} ({self.parser_evidence})")
        stops = ", ".join(repr(t) for t in self.stop_tokens)
        out.append(f"  end of turn: {self.turn_end} ({stops})")
        if self.end_tokens:
            out.append(f"  end of sequence: {', '.join(repr(t) for t in self.end_tokens)} (also end a turn)")
        out.append(f"  generation prompt: {self.generation_prompt!r}")
        if self.dropped_prompt:
            out.append(
                f"    (the template's own adds {self.dropped_prompt!r}, which its rendering of the next assistant "
                "turn does not start with: left out of every prompt)"
            )
        out.append(
            f"  tool results as role {self.tool_role!r}; tool-call arguments as "
            f"{'a mapping' if self.arguments_as == 'mapping' else 'a JSON string'}; "
            f"parallel calls: {'yes' if self.parallel_calls else 'no'}"
        )
        if self.tools:
            verdict = "NOT all usable" if self.tool_problems else "each shown, each call read back"
            out.append(
                f"  tools ({len(self.tools)}, offered in the probe): {', '.join(self.tools)}: {verdict}"
            )
            out += [f"    {problem}" for problem in self.tool_problems]
        if self.tito_safe and self.rewrites:
            out.append(
                "  token-in/token-out: safe (each prompt renders the new messages as the template does when the next turn "
                "is generated), "
                "but once later messages follow it renders:"
            )
            out += [f"    {shown!r} as {later!r}" for shown, later in self.rewrites]
            out.append(
                "    the trajectory keeps what the model was shown, which a full rendering of the finished "
                "conversation differs from there"
            )
        elif self.tito_safe:
            out.append("  token-in/token-out: safe (incremental rendering reproduces the full rendering)")
        else:
            out.append(f"  token-in/token-out: NOT safe: {self.reason}")
        return out


def check_template(
    tokenizer: Any,
    enable_thinking: bool | None,
    tool_parser: str = AUTO,
    tools: Sequence[Mapping[str, Any]] = (),
) -> TemplateReport:
    """Detect and probe everything token-in/token-out needs from ``tokenizer``; never raises on a bad template.
    ``tools``: an agent's tools (template-format, see ``to_template_tools``), offered in every rendering of the
    probe, each checked to be shown and its call read back by the parser."""
    name = str(getattr(tokenizer, "name_or_path", tokenizer))
    try:
        renderer = ChatRenderer(tokenizer, enable_thinking=enable_thinking, probe=False)
    except TemplateError as exc:
        return TemplateReport(name, enable_thinking, tito_safe=False, reason=str(exc))
    facts = renderer.facts
    reason: str | None = None
    rewrites: tuple[tuple[str, str], ...] = ()
    try:
        verdict = renderer.verdict(tools)
        parallel: bool | None = verdict.parallel_calls
        rewrites = verdict.rewrites
    except TemplateError as exc:
        parallel, reason = None, str(exc)
    problem = None
    try:
        if tool_parser == AUTO:
            parser, evidence = detect_tool_parser(renderer)
        else:
            parser = get_tool_parser(tool_parser).name
            evidence, problem = _explicit_parser(renderer, parser)
        family: str | None = get_tool_parser(parser).family
    except ConfigurationError as exc:
        parser, evidence, family = None, str(exc), None
    names = tuple(str(t["function"]["name"]) for t in tools)
    return TemplateReport(
        tokenizer=name,
        enable_thinking=enable_thinking,
        tito_safe=reason is None,
        reason=reason,
        parser=parser,
        family=family,
        parser_evidence=evidence,
        turn_end=facts.turn_end,
        stop_tokens=facts.stop_tokens,
        generation_prompt=facts.generation_prompt,
        arguments_as=facts.arguments_as,
        tool_role=facts.tool_role,
        parallel_calls=parallel,
        parser_problem=problem,
        end_tokens=facts.end_tokens,
        dropped_prompt=facts.dropped_prompt,
        rewrites=rewrites,
        tools=names,
        tool_problems=tuple(tool_problems(renderer, parser, tools)),
    )


def _explicit_parser(renderer: ChatRenderer, name: str) -> tuple[str, str | None]:
    """``(evidence, why the parser cannot read the template's tool calls or None)`` for a parser set by name."""
    turn = rendered_call_turn(renderer)
    if turn is None:
        return "set explicitly; the chat template renders no tool call to check it against", None
    why = why_unread(name, turn)
    if why is None:
        return "set explicitly; it reads the tool call the chat template renders", None
    problem = f"{name} cannot read the tool call the chat template renders ({why}); rendered: {turn[0]!r}"
    return f"set explicitly, but {problem}", problem
