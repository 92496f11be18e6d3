"""The MCP servers of one configuration: their tools read once, shared sessions per event loop, a fresh session
per episode for episode-scope servers.

One :class:`McpToolbox` belongs to a :class:`~slime_strands.agent.runtime.Runtime` (so it moves with it: a
rollout worker holding a runtime holds its own shared sessions). Everything runs on the loop that asks: a
shared server is opened by the first sample of a loop (:meth:`McpToolbox.preflight`), its tool list read once,
and its calls multiplexed by every episode of that loop; it is closed by :meth:`McpToolbox.aclose`, or when the
loop ends (its owner task cancelled) or the process ends (the server reads EOF on its stdin). An episode-scope
server is started by :meth:`McpToolbox.episode` before the episode's first turn and stopped when the episode
ends, however it ends; at most ``max_live`` of them per server are alive at once (more episodes wait). A dead
episode-scope server is not restarted within its episode (its state is gone: its calls are tool errors); a dead
shared session is reopened on a later call, at most once per ``backoff`` (1 s, doubling to 60 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import weakref
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigurationError
from ..settings import McpServerSettings
from .connection import Connection, McpCallError, McpServerError
from .tool import McpTool, tool_spec

__all__ = ["McpToolbox"]

_OFFERED_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""What a tool name may be (Strands' rule, and what every chat template's function names can hold)."""
_FIRST_BACKOFF_S = 1.0
_MAX_BACKOFF_S = 60.0


class McpToolbox:
    """The tools of ``servers`` for the episodes of every event loop that asks."""

    def __init__(self, servers: Sequence[McpServerSettings]) -> None:
        self.servers = tuple(servers)
        self._offered: dict[str, list[McpTool]] | None = (
            None  # by server, unbound: read at the first preflight
        )
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = (
            weakref.WeakKeyDictionary()
        )

    def __bool__(self) -> bool:
        return bool(self.servers)

    def offered(self) -> list[McpTool]:
        """Every MCP tool the agent is offered, as listed at the first preflight (for their specs: a template's
        tools, a trajectory's digest); empty before it."""
        return [tool for tools in (self._offered or {}).values() for tool in tools]

    async def preflight(self, taken: Collection[str] = ()) -> None:
        """At a loop's first sample: open the shared sessions, read every server's tool list (an episode-scope
        server is started once for it, then stopped), check the allow-lists and that no offered name is one of
        ``taken`` (the Python tools') or another server's. Any failure is a ConfigurationError (one line, the
        server's stderr tail). Cheap after the first call on a loop."""
        state = self._state()
        if state.ready:
            return
        async with state.lock:
            if state.ready:
                return
            offered: dict[str, list[McpTool]] = {}
            try:
                for server in self.servers:
                    if server.scope == "shared":
                        shared = _Shared(server)
                        state.shared[server.name] = shared
                        listed = await shared.open()
                        offered[server.name] = [t.bound_to(shared.call) for t in _offer(server, listed)]
                    else:
                        connection = Connection(server)
                        try:
                            await connection.open(list_tools=True)
                        finally:
                            await connection.close()
                        offered[server.name] = _offer(server, connection.tools)
                        state.slots[server.name] = asyncio.Semaphore(server.max_live)
                _check_names(offered, taken)
            except McpServerError as exc:
                await self._close_loop(state)
                raise ConfigurationError(str(exc)) from None
            except ConfigurationError:
                await self._close_loop(state)
                raise
            state.shared_tools = [t for s in self.servers if s.scope == "shared" for t in offered[s.name]]
            if self._offered is None:
                self._offered = offered
            state.episode_tools = {s.name: offered[s.name] for s in self.servers if s.scope == "episode"}
            state.ready = True

    @contextlib.asynccontextmanager
    async def episode(self, *, images: bool = True) -> AsyncIterator[list[McpTool]]:
        """The MCP tools of one episode: the shared ones, and those of a session of each episode-scope server
        opened for it (waiting for a ``max_live`` slot), closed when the block ends however it ends (its
        stdio process tree killed). A server that does not start raises :class:`McpServerError` (that episode
        fails; at the first sample it is a configuration error, from :meth:`preflight`). ``images`` false (a
        text model): the images servers send become lines saying so."""
        await self.preflight()
        state = self._state()
        tools = [tool.bound_to(tool.call, images=images) for tool in state.shared_tools]
        opened: list[Connection] = []
        held: list[asyncio.Semaphore] = []
        try:
            for server in self.servers:
                if server.scope != "episode":
                    continue
                slot = state.slots[server.name]
                await slot.acquire()
                held.append(slot)
                connection = Connection(server)
                opened.append(connection)
                await connection.open()
                tools.extend(
                    t.bound_to(connection.call, images=images) for t in state.episode_tools[server.name]
                )
            yield tools
        finally:
            if opened or held:
                await _close_all(opened, held)

    async def aclose(self) -> None:
        """Close this loop's shared sessions (their servers stopped); the next sample opens them again."""
        state = self._loops.pop(asyncio.get_running_loop(), None)
        if state is not None:
            await self._close_loop(state)

    async def _close_loop(self, state: _LoopState) -> None:
        await asyncio.gather(*(shared.close() for shared in state.shared.values()), return_exceptions=True)
        state.shared.clear()

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            state = self._loops[loop] = _LoopState()
        return state


@dataclass
class _LoopState:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    ready: bool = False
    shared: dict[str, _Shared] = field(default_factory=dict)
    shared_tools: list[McpTool] = field(default_factory=list)
    episode_tools: dict[str, list[McpTool]] = field(default_factory=dict)
    slots: dict[str, asyncio.Semaphore] = field(default_factory=dict)


class _Shared:
    """A shared server's session on one loop, reopened after it dies (at most once per backoff)."""

    def __init__(self, server: McpServerSettings) -> None:
        self.server = server
        self._connection = Connection(server)
        self._lock = asyncio.Lock()
        self._backoff = _FIRST_BACKOFF_S
        self._next_try = 0.0
        self._closed = False

    async def open(self) -> list[Any]:
        await self._connection.open(list_tools=True)
        return self._connection.tools

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        connection = self._connection
        if not connection.alive:
            connection = await self._reopened(connection)
        return await connection.call(name, arguments)

    async def _reopened(self, dead: Connection) -> Connection:
        async with self._lock:
            if self._connection is not dead:  # another call reopened it meanwhile
                return self._connection
            now = time.monotonic()
            if self._closed or now < self._next_try:
                raise McpCallError(
                    f"the MCP server {self.server.name!r} is down (it is reopened later)", dead=True
                )
            await dead.close()
            fresh = Connection(self.server)
            try:
                await fresh.open()
            except McpServerError as exc:
                self._next_try = time.monotonic() + self._backoff
                self._backoff = min(self._backoff * 2, _MAX_BACKOFF_S)
                raise McpCallError(
                    f"the MCP server died and could not be reopened: {exc}", dead=True
                ) from None
            self._backoff = _FIRST_BACKOFF_S
            self._connection = fresh
            return fresh

    async def close(self) -> None:
        self._closed = True
        await self._connection.close()


def _offer(server: McpServerSettings, listed: Sequence[Any]) -> list[McpTool]:
    """The tools ``server`` offers the agent (its allow-list, in the server's order), unbound."""
    by_name = {tool.name: tool for tool in listed}
    wanted = list(by_name) if server.tools is None else list(server.tools)
    missing = [name for name in wanted if name not in by_name]
    if missing or not wanted:
        what = f"lists no tool {missing[0]!r}" if missing else "lists no tools"
        raise ConfigurationError(
            f"MCP server {server.name!r} {what} (it lists: {sorted(by_name) or 'nothing'}): fix "
            f"mcp_servers[{server.name}].tools"
        )
    offered = []
    for name in wanted:
        shown = f"{server.prefix}_{name}" if server.prefix else name
        if not _OFFERED_NAME.match(shown):
            raise ConfigurationError(
                f"MCP tool {shown!r} of server {server.name!r} cannot be offered (a tool name is 1-64 letters, "
                f"digits, '_' or '-'): set a shorter mcp_servers[{server.name}].prefix, or leave the tool out of "
                f"mcp_servers[{server.name}].tools"
            )
        offered.append(McpTool(shown, tool_spec(shown, by_name[name]), name, _unbound, server=server.name))
    return offered


def _check_names(offered: dict[str, list[McpTool]], taken: Collection[str]) -> None:
    owner = {name: "the Python tool" for name in taken}
    for server, tools in offered.items():
        for tool in tools:
            if tool.tool_name in owner:
                raise ConfigurationError(
                    f"MCP tool {tool.tool_name!r} of server {server!r} has the name of {owner[tool.tool_name]} "
                    f"{tool.tool_name!r}: set mcp_servers[{server}].prefix, or leave the tool out of "
                    f"mcp_servers[{server}].tools"
                )
            owner[tool.tool_name] = f"server {server!r}'s tool"


async def _unbound(name: str, arguments: dict[str, Any]) -> Any:
    raise McpCallError(
        "this MCP tool is not bound to a session (an episode's tools come from McpToolbox.episode)"
    )


async def _close_all(connections: list[Connection], slots: list[asyncio.Semaphore]) -> None:
    """Close ``connections`` and then free ``slots``, to the end even when the caller is cancelled."""
    closing = asyncio.ensure_future(asyncio.gather(*(c.close() for c in connections), return_exceptions=True))

    def release(_: object) -> None:
        for slot in slots:
            slot.release()

    closing.add_done_callback(release)
    await asyncio.shield(closing)
