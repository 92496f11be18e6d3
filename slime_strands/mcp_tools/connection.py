"""One MCP session (a stdio server process, or a streamable-HTTP session) owned by a task of its own.

The ``mcp`` package's transports and ``ClientSession`` are anyio context managers that must be entered and left
by one task, and whose task groups cancel their host when the connection breaks. So each session gets an
owner task that enters them, says it is ready, and waits to be told to close: a server that dies ends only
the owner, never an episode, and the calls of any task of the loop are multiplexed on the session. Closing
(however the episode ended, cancellation included) leaves the transports, which kill a stdio server's whole
process group (the mcp package starts it in a new session) after closing its stdin.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from typing import IO, Any, TextIO, cast

from ..errors import SlimeStrandsError
from ..settings import McpServerSettings

__all__ = ["Connection", "McpCallError", "McpServerError"]

_STDERR_TAIL_CHARS = 400


class McpServerError(SlimeStrandsError):
    """An MCP server could not be started or reached (its stderr's tail in the message)."""


class McpCallError(SlimeStrandsError):
    """One call failed (timeout, a dead server, a malformed answer): the model sees it as a tool error."""

    def __init__(self, message: str, *, dead: bool = False) -> None:
        super().__init__(message)
        self.dead = dead


class Connection:
    """An open MCP session to ``server``: :meth:`open`, then :meth:`call` from any task, then :meth:`close`."""

    def __init__(self, server: McpServerSettings) -> None:
        self.server = server
        self._session: Any = None
        self._owner: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._stderr: IO[str] | None = None
        self._dead = False  # the server closed the connection: no call is sent on it again
        self.tools: list[Any] = []
        """The tools the server listed (``mcp`` Tool objects) when :meth:`open` was asked to list them."""

    @property
    def alive(self) -> bool:
        return (
            not self._dead
            and self._owner is not None
            and not self._owner.done()
            and self._session is not None
        )

    async def open(self, *, list_tools: bool = False) -> None:
        """Start the server (stdio) or open the HTTP session, MCP's initialize answered within
        ``startup_timeout_s``; :class:`McpServerError` with the server's stderr tail otherwise."""
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        if self.server.transport == "stdio":
            # closed by close(), after the owner is done with it
            self._stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
        self._owner = asyncio.create_task(self._own(ready, list_tools), name=f"mcp:{self.server.name}")
        try:
            done, _ = await asyncio.wait(
                {ready, self._owner},
                timeout=self.server.startup_timeout_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
        except asyncio.CancelledError:
            await self.close()
            raise
        if ready in done and ready.exception() is None:
            return
        failure = self._owner.exception() if self._owner.done() and not self._owner.cancelled() else None
        if ready.done() and ready.exception() is not None:
            failure = ready.exception()
        reason = (
            f"did not answer MCP's initialize within {self.server.startup_timeout_s:g} s (startup_timeout_s)"
            if failure is None
            else f"failed to start: {_describe(failure)}"
        )
        tail = self.stderr_tail()
        await self.close()
        raise McpServerError(f"MCP server {self.server.name!r} ({self._where()}) {reason}{tail}")

    async def _own(self, ready: asyncio.Future[None], list_tools: bool) -> None:
        from mcp.client.session import ClientSession

        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                if list_tools:
                    self.tools = await _all_tools(session)
                self._session = session
                if not ready.done():
                    ready.set_result(None)
                await self._closing.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else McpServerError(repr(exc)))
                ready.exception()  # retrieved: open() reports it
            if not isinstance(exc, (Exception, asyncio.CancelledError)):
                raise
        finally:
            self._session = None

    def _transport(self) -> contextlib.AbstractAsyncContextManager[Any]:
        server = self.server
        if server.transport == "stdio":
            from mcp.client.stdio import StdioServerParameters, stdio_client

            assert server.command is not None and self._stderr is not None
            params = StdioServerParameters(
                command=server.command, args=list(server.args), env=server.env, cwd=server.cwd
            )
            return stdio_client(params, errlog=cast(TextIO, self._stderr))
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        assert server.url is not None
        return _http(streamable_http_client, create_mcp_http_client(headers=server.headers), server.url)

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """The server's ``CallToolResult`` for one call; :class:`McpCallError` when there is none."""
        session = self._session
        if session is None or not self.alive:
            raise McpCallError(f"the MCP server {self.server.name!r} is not running", dead=True)
        timeout = self.server.call_timeout_s
        try:
            return await asyncio.wait_for(session.call_tool(name, arguments), timeout)
        except asyncio.TimeoutError:
            raise McpCallError(f"no answer within {timeout:g} s (call_timeout_s)") from None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            from mcp.shared.exceptions import MCPError
            from mcp_types import CONNECTION_CLOSED

            if isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED:
                self._dead = True
                raise McpCallError(
                    f"the MCP server {self.server.name!r} closed the connection (it died?)"
                    f"{self.stderr_tail()}",
                    dead=True,
                ) from None
            if isinstance(exc, MCPError):
                raise McpCallError(f"the MCP server answered an error: {exc.error.message}") from None
            raise McpCallError(f"the MCP call failed: {_describe(exc)}") from None

    async def close(self) -> None:
        """Leave the session and stop the server (its process tree killed); idempotent, finishes under cancel."""
        self._closing.set()
        owner = self._owner
        if owner is not None and not owner.done():
            try:
                await asyncio.shield(owner)
            except asyncio.CancelledError:
                if not owner.done():
                    raise  # the caller is cancelled: the owner still finishes its shielded shutdown
            except Exception:
                pass
        if self._stderr is not None and (owner is None or owner.done()):
            self._stderr.close()
            self._stderr = None

    def stderr_tail(self) -> str:
        """``; stderr: ...`` with the last lines the server wrote to stderr, or nothing."""
        if self._stderr is None or self._stderr.closed:
            return ""
        try:
            self._stderr.flush()
            size = os.fstat(self._stderr.fileno()).st_size
            with open(self._stderr.fileno(), "rb", closefd=False) as raw:
                raw.seek(max(0, size - _STDERR_TAIL_CHARS))
                text = raw.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""
        text = " | ".join(line.strip() for line in text.strip().splitlines() if line.strip())
        return f"; stderr: {text}" if text else ""

    def _where(self) -> str:
        server = self.server
        if server.transport == "stdio":
            return " ".join([str(server.command), *server.args])
        return str(server.url)


@contextlib.asynccontextmanager
async def _http(client_factory: Any, http_client: Any, url: str) -> Any:
    async with http_client, client_factory(url, http_client=http_client) as streams:
        yield streams


async def _all_tools(session: Any) -> list[Any]:
    tools: list[Any] = []
    cursor = None
    while True:
        if cursor is None:
            page = await session.list_tools()
        else:
            from mcp_types import PaginatedRequestParams

            page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor))
        tools.extend(page.tools)
        cursor = getattr(page, "next_cursor", None)
        if not cursor:
            return tools


def _describe(exc: BaseException) -> str:
    """An exception (an anyio group's first leaf) as one line."""
    while getattr(exc, "exceptions", None):  # an exception group (anyio's task groups raise them)
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
