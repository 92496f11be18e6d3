"""Agent-as-tool: a Strands tool that hands a task to a sub-agent running on the policy.

    from slime_strands.subagents import subagent_tool

    checker = subagent_tool(
        "check_answer",
        "Ask a fresh agent to check a candidate answer; give it the problem and the answer.",
        system_prompt="You verify answers. Compute carefully, then reply VALID or INVALID with a reason.",
        tools=[execute_python_code],
    )

Configure it like any tool (``tools: [my_module.checker]``). Each call runs a new Strands ``Agent`` on a model
spawned from the calling agent's :class:`~slime_strands.provider.model.SGLangModel`: the same client (connection
pool), tokenizer, chat template, tool parser, sampling params, budgets, routing key (the same worker's
prefix cache) and abort handling, with a token trajectory of its own. With ``collect_subagents: true`` that
trajectory becomes a sibling sample of the episode (it shares the episode's ``rollout_id`` and reward);
otherwise the sub-agent is just a tool. The sub-agent's final text is the tool's result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from strands import Agent, tool
from strands.types.tools import AgentTool, ToolContext

from ..errors import ConfigurationError, SlimeStrandsError
from ..provider.model import SGLangModel
from .episode import build_agent, run_agent
from .limits import StopWhen, ToolLimiter
from .record import TREATMENTS, Termination
from .segment_collector import COLLECTOR_KEY, SegmentCollector

__all__ = ["SubagentError", "subagent_tool"]


class SubagentError(SlimeStrandsError, RuntimeError):
    """The sub-agent could not run (not under an SGLangModel) or ended without anything to return."""


def subagent_tool(
    name: str,
    description: str,
    *,
    system_prompt: str | None = None,
    tools: Sequence[Any] = (),
    max_tool_iters: int | None = 5,
    max_tool_calls: int | None = None,
) -> AgentTool:
    """A Strands tool named ``name`` that runs a sub-agent on the task the calling model writes.

    ``system_prompt`` and ``tools`` are the sub-agent's; ``max_tool_iters`` / ``max_tool_calls`` bound its
    tool use (see :class:`~slime_strands.agent.limits.ToolLimiter`). A sub-agent cannot call the tool that runs it
    unless it is among ``tools``.
    """
    if not name.isidentifier():
        raise ConfigurationError(f"subagent_tool: {name!r} is not a valid tool name (letters, digits, _)")
    if not description.strip():
        raise ConfigurationError(f"subagent_tool {name!r}: the description tells the model when to call it")
    sub_tools = list(tools)

    async def run_subagent(task: str, tool_context: ToolContext) -> str:
        """Hand a task to the sub-agent and return its final answer.

        Args:
            task: Everything the sub-agent needs to know: it does not see this conversation.
        """
        parent = tool_context.agent.model
        if not isinstance(parent, SGLangModel):
            raise SubagentError(
                f"{name}: the calling agent's model is a {type(parent).__name__}, not an SGLangModel"
            )
        model = parent.spawn()
        limiter = ToolLimiter(max_tool_iters=max_tool_iters, max_tool_calls=max_tool_calls)
        abort = model.config["abort_signal"]
        guard = StopWhen(abort, "slime aborted the rollout") if abort is not None else None
        agent = build_agent(
            model,
            tools=sub_tools,
            hooks=[h for h in (limiter, guard) if h is not None],
            system_prompt=system_prompt,
        )
        segments = tool_context.invocation_state.get(COLLECTOR_KEY)
        state = {COLLECTOR_KEY: segments} if isinstance(segments, SegmentCollector) else None
        termination, error = await run_agent(
            agent, task, limiter=limiter, guard=guard, invocation_state=state
        )
        if isinstance(segments, SegmentCollector):
            segments.add_subagent(name, model, termination)
        answer = _final_text(agent)
        if not TREATMENTS[termination].trains or not answer:
            raise SubagentError(
                f"{name} ended without an answer ({termination.value}{': ' + error if error else ''})"
            )
        if termination is not Termination.END_TURN:
            answer += f"\n[the sub-agent stopped early: {termination.value}]"
        return answer

    decorated: AgentTool = tool(name=name, description=description, context=True)(run_subagent)
    return decorated


def _final_text(agent: Agent) -> str:
    """The text of the sub-agent's last assistant message (its reasoning left out)."""
    for message in reversed(agent.messages):
        if message.get("role") == "assistant":
            return "".join(block.get("text", "") for block in message.get("content", [])).strip()
    return ""
