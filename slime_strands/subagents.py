"""The public dotted path ``slime_strands.subagents`` (users write it in YAML tool lists and docs): a
re-export of ``slime_strands.agent.subagents``, where the code lives.
"""

from .agent.subagents import SubagentError, subagent_tool

__all__ = ["SubagentError", "subagent_tool"]
