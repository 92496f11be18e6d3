"""The benchmarks' shared tool: ``lookup`` returns ``count`` deterministic words about a topic (what a
research agent's search tool returns). A module of its own, so that a rollout worker can import it by its
dotted path (``bench_tools.lookup``) and each benchmark agent offers the same tool."""

from __future__ import annotations

from bench_client import _words
from strands import tool


@tool
def lookup(topic: str, count: int) -> str:
    """Look up `count` records about a topic.

    Args:
        topic: what to look up.
        count: how many words of records to return.
    """
    return _words(topic, count)
