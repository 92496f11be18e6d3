"""AgentHistory: an agent's message list whose deep copy is made in C.

Strands deep-copies ``agent.messages`` twice for every model call (the model-call middleware's context, then
``_normalize_messages``), so that nothing downstream can edit the agent's history. ``copy.deepcopy`` walks
every dict and list of the conversation in Python, allocating a memo entry per container: at 512 concurrent
agents it was the largest single cost of a Strands turn (``benchmarks/bench_client.py``, the ``null-ours``
row). Strands' messages are plain JSON-like values, and for those one pickle round trip, done in C, gives the
same thing: an equal, independent copy with shared references and cycles preserved.

The pickle path only ever sees values pickle handles natively (``None``, ``bool``, ``int``, ``float``, ``str``,
``bytes``, ``bytearray``, ``dict``, ``list``, ``tuple``, ``set``, ``frozenset``; exact types only). Anything
else in the history (an object, an enum, a subclass of a builtin) sends the whole copy to ``copy.deepcopy``,
so the result is always what deepcopy gives.
"""

from __future__ import annotations

import copy
import io
import pickle
from typing import Any

__all__ = ["AgentHistory"]


class _NotPlainData(Exception):
    """A value pickle would have to reduce: deep-copy it the general way."""


class _PlainDataPickler(pickle.Pickler):
    # The C pickler asks reducer_override only about values it has no native code for.
    def reducer_override(self, obj: Any) -> Any:
        raise _NotPlainData


class AgentHistory(list[Any]):
    """A ``list`` of Strands messages (pass it as ``Agent(messages=...)``); copies of it are ``AgentHistory``
    too, so the second deep copy of the same model call is fast as well."""

    __slots__ = ()

    def __deepcopy__(self, memo: dict[int, Any]) -> AgentHistory:
        buffer = io.BytesIO()
        try:
            _PlainDataPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(list(self))
        except _NotPlainData:
            return AgentHistory(copy.deepcopy(list(self), memo))
        return AgentHistory(pickle.loads(buffer.getbuffer()))
