"""The state that outlives one episode: one object per configuration, not module globals.

A :class:`Runtime` holds the SGLang client (one connection pool for every episode), the tokenizer (loaded
once, off the event loop), the imported tools and the chat-template configurations already checked.
:meth:`Runtime.preflight` runs before every episode and does real work only the first time for a given
configuration: it surfaces everything that would make EVERY episode fail the same way as a
:class:`~slime_strands.errors.ConfigurationError` with the fix in its message, so a run stops at its first
sample instead of training on nothing.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import importlib
import threading
import weakref
from collections.abc import Mapping
from typing import Any, ClassVar

from strands.types.tools import AgentTool

from ..errors import ConfigurationError
from ..mcp_tools import McpToolbox
from ..provider.abort_signal import AbortSignal
from ..provider.client import SGLangClient
from ..provider.images import Vision, load_vision
from ..settings import PluginSettings
from ..template.render import ChatRenderer

__all__ = ["Runtime", "client_for", "import_tools", "raise_gc_threshold"]


class Runtime:
    """Client, tokenizer, tools and checked templates shared by the episodes of one configuration."""

    _loaded_tokenizers: ClassVar[weakref.WeakValueDictionary[str, Any]] = weakref.WeakValueDictionary()
    """Tokenizers loaded from a path, shared by every runtime of the process that names the same path (a
    training and an eval configuration; one load, one copy in memory: ~85 MB for Qwen3)."""
    _load_lock: ClassVar[threading.Lock] = threading.Lock()  # loads run in executor threads

    def __init__(
        self,
        settings: PluginSettings,
        client: SGLangClient,
        *,
        tokenizer_path: str | None = None,
        tokenizer: Any = None,
        vision: Vision | None = None,
    ) -> None:
        """``vision``: a vision-language model's image processor (default: loaded from ``tokenizer_path`` when
        that is a vision-language checkpoint, see :func:`~slime_strands.provider.images.load_vision`)."""
        self.settings = settings
        self.client = client
        self._tokenizer_path = tokenizer_path
        self._tokenizer = tokenizer
        self._vision: tuple[Vision | None] | None = (
            (vision,) if vision is not None or not tokenizer_path else None
        )
        self._tools: list[Any] | None = None
        self._checked_templates: set[str] = set()
        self._isolation_checked = False
        self._abort: tuple[Any, AbortSignal] | None = None
        self.mcp = McpToolbox(settings.mcp_servers)
        """The MCP servers' tools: shared sessions per event loop, opened by :meth:`preflight`."""

    def __repr__(self) -> str:
        return f"Runtime({self.client!r}, tokenizer={self._tokenizer_path!r})"

    @property
    def tokenizer_path(self) -> str | None:
        """Where the tokenizer loads from (a rollout worker loads its own copy from there)."""
        return self._tokenizer_path

    async def tokenizer(self) -> Any:
        """The tokenizer given at construction, else ``AutoTokenizer(tokenizer_path)``, loaded once per process."""
        if self._tokenizer is None:
            await asyncio.get_running_loop().run_in_executor(None, self._load_tokenizer)
        return self._tokenizer

    def _load_tokenizer(self) -> None:
        path = self._tokenizer_path
        if not path:
            raise ConfigurationError("no tokenizer: set --hf-checkpoint (slime) or pass tokenizer_path")
        with self._load_lock:
            if self._tokenizer is not None:
                return
            tokenizer = self._loaded_tokenizers.get(path)
            if tokenizer is None:
                from transformers import AutoTokenizer

                try:
                    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
                except Exception as exc:
                    raise ConfigurationError(
                        f"cannot load the tokenizer of {path!r}: {type(exc).__name__}: {exc}"
                    ) from exc
                self._loaded_tokenizers[path] = tokenizer
            self._tokenizer = tokenizer

    async def vision(self) -> Vision | None:
        """The model's :class:`Vision` (None for a text model), loaded once from ``tokenizer_path``."""
        if self._vision is None:
            path = self._tokenizer_path
            loaded = (
                await asyncio.get_running_loop().run_in_executor(None, load_vision, path) if path else None
            )
            self._vision = (loaded,)
        return self._vision[0]

    def abort_signal(self, state: Any) -> AbortSignal:
        """slime's abort flag (``state.aborted``, ``state`` its GenerateState) as one AbortSignal for every
        episode: one poller watches it for all the tool calls running when slime aborts."""
        if self._abort is None or self._abort[0] is not state:
            self._abort = (state, AbortSignal(lambda: bool(state.aborted)))
        return self._abort[1]

    def tools(self) -> list[Any]:
        """The configured tools, imported once (see :func:`import_tools`)."""
        if self._tools is None:
            self._tools = import_tools(self.settings)
        return list(self._tools)

    def offered_tools(self) -> list[Any]:
        """The tools every episode is offered: :meth:`tools` and the MCP servers' (known after :meth:`preflight`),
        for their specs (what the chat template renders, a trajectory's digest)."""
        return [*self.tools(), *self.mcp.offered()]

    async def preflight(self, tokenizer: Any, template_kwargs: Mapping[str, Any]) -> None:
        """Raise ConfigurationError for what would fail every episode; cheap after the first call.

        Checks: the settings (validated when they were built); the tools (import); the MCP servers (they start,
        list the allowed tools, no name twice); the sandbox when its tool is
        configured (isolation must work unless ``sandbox.backend: limits`` opts out: ``SandboxIsolationError``;
        with ``sandbox.placement: ray`` the pool starts, each worker checking isolation on its node, or
        ``SandboxPoolError`` says why it cannot; ``return_figures`` needs a vision-language model); the chat
        template with these template variables (it must render incrementally token-in/token-out:
        ``ChatRenderer``'s probe).
        """
        tools = self.tools()
        if self.mcp:  # shared sessions opened, tool lists read, names checked: once per event loop
            await self.mcp.preflight([tool.tool_name for tool in tools])
        if not self._isolation_checked and _uses_sandbox(self.settings):
            from ..sandbox import ensure_isolation

            await ensure_isolation(self.settings.sandbox)  # also warms the interpreter the first runs use
            if self.settings.sandbox.return_figures and await self.vision() is None:
                raise ConfigurationError(
                    "sandbox.return_figures shows the model the figures its code saves, but the model has no "
                    "image processor (a text checkpoint): set sandbox.return_figures: false, or use a "
                    "vision-language checkpoint"
                )
            self._isolation_checked = True
        kwargs = dict(template_kwargs)
        if self.settings.enable_thinking is not None:
            kwargs.setdefault("enable_thinking", self.settings.enable_thinking)
        key = repr(sorted(kwargs.items()))
        if key in self._checked_templates:
            return
        probe = functools.partial(ChatRenderer, tokenizer, template_kwargs=kwargs)
        await asyncio.get_running_loop().run_in_executor(None, probe)  # TemplateError is a ConfigurationError
        self._checked_templates.add(key)


def client_for(settings: PluginSettings, base_url: str, *, max_connections: int) -> SGLangClient:
    """The client of a configuration: its request timeout and retry policy from the settings (the one place the
    plugin builds one: slime's rollout and ``slime-strands eval`` alike)."""
    return SGLangClient(
        base_url,
        max_connections=max_connections,
        timeout=settings.request_timeout_s,
        retry=settings.retry_policy,
    )


def import_tools(settings: PluginSettings) -> list[Any]:
    """Import the Strands tools named by ``settings.tools`` (dotted paths), configuring the sandbox when its
    tool is among them; any problem is a ConfigurationError naming the path."""
    tools = []
    for path in settings.tools:
        module_name, _, attr = path.rpartition(".")
        if not module_name or not attr:
            raise ConfigurationError(f"tools: {path!r} must be a dotted path: package.module.tool")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            raise ConfigurationError(
                f"tools: {path!r} cannot be imported: {type(exc).__name__}: {exc}"
            ) from exc
        tool = getattr(module, attr, None)
        if tool is None:
            raise ConfigurationError(f"tools: module {module_name!r} has no attribute {attr!r}")
        if not isinstance(tool, AgentTool):
            raise ConfigurationError(
                f"tools: {path!r} is a {type(tool).__name__}, not a Strands tool (decorate it with @strands.tool)"
            )
        tools.append(tool)
    if _uses_sandbox(settings):
        from ..sandbox import configure_sandbox

        configure_sandbox(settings.sandbox)
    return tools


def _uses_sandbox(settings: PluginSettings) -> bool:
    return any(path.startswith("slime_strands.sandbox") for path in settings.tools)


def raise_gc_threshold(settings: PluginSettings) -> None:
    """Raise the collector's generation-0 threshold to ``settings.gc_young_threshold`` (see its doc).

    Process-wide, so it only ever raises it: a process that set a higher one, or disabled the collector,
    keeps its choice; the older generations' thresholds are left as they are. Cheap: every episode calls it.
    """
    young = settings.gc_young_threshold
    if young is None or not gc.isenabled():
        return
    current = gc.get_threshold()
    if current[0] < young:
        gc.set_threshold(young, *current[1:])
