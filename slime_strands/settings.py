"""The plugin's settings: one frozen object, documented defaults, strict validation.

Users set them with slime's ``--custom-config-path some.yaml``, which copies every top-level YAML key
onto ``args``. This plugin reads ONE key, ``strands``, so its settings never collide with slime's::

    strands:
      system_prompt: "..."
      max_tool_iters: 5
      sandbox: {timeout_s: 10}
      reward: {tool_shaping: true}
      context_management: summarize
      compaction: {trigger_share: 0.8}
      sampling_params: {top_k: 20, stop: ["</answer>"], regex: "..."}

Unknown keys raise ``SettingsError`` naming the key (a typo must not silently fall back to a default). The
section's own name is checked too: in the plugin's own settings file (``slime-strands eval --config``,
``validate-config``) ``strands`` is the only top-level key; in a file for slime's ``--custom-config-path``
and in slime's ``args``, which may legitimately hold keys meant for slime or other plugins, a near-miss of
``strands`` (``strand``, ``Strands``, ``stands``, ...) is an error, since the settings under it would be
ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigurationError
from .provider.retry import RetryPolicy
from .provider.sampling import SamplingParamError, SamplingParams
from .strict_reader import is_int
from .tool_parsers import AUTO, registered_tool_parsers

__all__ = [
    "COMPACTION_STRATEGIES",
    "CONTEXT_MANAGEMENT",
    "DEFAULT_SUMMARY_PROMPT",
    "DEFAULT_SYSTEM_PROMPT",
    "DEFAULT_TOOL_ROUNDS_PER_INVOCATION",
    "MCP_SCOPES",
    "MCP_TRANSPORTS",
    "REWARD_KINDS",
    "SANDBOX_BACKENDS",
    "SANDBOX_PLACEMENTS",
    "STALENESS_ACTIONS",
    "CodeRewardSettings",
    "CompactionSettings",
    "McpServerSettings",
    "PluginSettings",
    "RayPoolSettings",
    "RewardSettings",
    "RolloutWorkersSettings",
    "SandboxSettings",
    "SettingsError",
    "StalenessSettings",
    "settings_from_slime",
]

ARGS_KEY = "strands"

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful mathematician. Solve the problem step by step. You can run Python code with the "
    "`execute_python_code` tool to compute, check or explore (numpy and sympy are available; print what "
    "you want to see). When you are done, give the final answer on its own line as "
    "`Answer: \\boxed{<answer>}`."
)

DEFAULT_SUMMARY_PROMPT = (
    "Your context is almost full and the conversation above will be replaced by your summary. Write a summary "
    "that lets you continue the task without it: the task, what you tried, the tool results that matter "
    "(numbers, code, errors), what is settled and what remains to do. Write only the summary; do not call tools."
)
COMPACTION_STRATEGIES = ("summarize", "sliding_window")
"""The ways ``context_management`` rewrites a history; each is also the ``SegmentRecord.opened_by`` of a segment
that starts from a history so rewritten."""
CONTEXT_MANAGEMENT = ("none", *COMPACTION_STRATEGIES)
"""Values of ``PluginSettings.context_management``."""
DEFAULT_TOOL_ROUNDS_PER_INVOCATION = 16
"""``tool_rounds_per_invocation``'s default: Strands' nesting stays under ~60 generator levels, and an
invocation's own overhead is paid once per 16 rounds (``slime_strands.agent.pacing``)."""


SANDBOX_BACKENDS = ("auto", "bwrap", "unshare", "limits", "camel")
"""Values of ``SandboxSettings.backend``: how a snippet is isolated (``slime_strands.sandbox`` holds an object per
value)."""
SANDBOX_PLACEMENTS = ("local", "ray")
"""Values of ``SandboxSettings.placement``: where snippets run (``slime_strands.sandbox`` holds an object per
value)."""


REWARD_KINDS = ("math", "code")
"""Values of ``RewardSettings.kind``: the reward eval grades with (``slime_strands.reward`` maps each to its
function)."""


class SettingsError(ConfigurationError):
    """A settings file or mapping is invalid (unknown key, wrong type, out-of-range value)."""


@dataclass(frozen=True)
class RayPoolSettings:
    """The pool of Ray actors ("sandbox workers") that runs model-written code with ``sandbox.placement: ray``.

    Each worker hosts the same sandbox as a local run (the same backend and limits; isolation is checked on the
    worker's node when it starts) and runs ``slots_per_worker`` snippets at once; workers are spread over the
    cluster's nodes."""

    workers: int = 2
    """Sandbox workers (Ray actors) in the pool."""
    slots_per_worker: int = 4
    """Snippets one worker runs at once (its sandbox's concurrency). The pool runs ``workers`` x
    ``slots_per_worker`` at once; more wait for a free slot."""
    cpus_per_worker: float = 1.0
    """Ray CPUs each worker reserves (fractions allowed). CPU-bound code wants about one per slot."""
    custom_resource: str | None = None
    """A custom Ray resource each worker needs one unit of, to pin workers to the nodes that advertise it
    (``ray start --resources '{"sandbox": 8}'``: at most 8 workers there); null: any node with free CPUs."""
    max_waiting: int = 10_000
    """Executions that may wait for a free slot; one more gets a tool error at once (memory stays bounded)."""
    start_timeout_s: float = 120.0
    """How long the pool waits for its workers to start (placed, imported, sandbox warm) before the first
    sample stops with a configuration error; a replacement that takes longer is tried again later."""

    def __post_init__(self) -> None:
        for name in ("workers", "slots_per_worker", "max_waiting", "start_timeout_s"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"sandbox.ray.{name} must be > 0, got {getattr(self, name)!r}")
        if self.cpus_per_worker < 0:
            raise SettingsError(f"sandbox.ray.cpus_per_worker must be >= 0, got {self.cpus_per_worker!r}")
        if self.custom_resource is not None and not self.custom_resource.strip():
            raise SettingsError("sandbox.ray.custom_resource must be a resource name or null")


@dataclass(frozen=True)
class SandboxSettings:
    """Limits, backend and placement of the Python sandbox that runs model-written code."""

    backend: str = "auto"
    """``auto``: namespace isolation by bubblewrap, else ``unshare``; where neither works, runs raise
    ``SandboxIsolationError`` (a ``ConfigurationError`` saying what failed and how to fix it) instead of
    running unisolated. ``bwrap`` / ``unshare``: that backend, or the same error. ``limits``: NO namespace
    isolation (rlimits, a scrubbed environment and, as root, a separate uid only; the code can read
    world-readable host files and use the network), only when set here; it warns at every start.
    ``camel``: camel-ai's UNISOLATED SubprocessInterpreter (parity with slime's example only)."""
    placement: str = "local"
    """Where snippets run: ``local``, in this process's sandbox; ``ray``, on a pool of Ray actors spread over
    the cluster (``ray`` below), each hosting the same sandbox (``backend`` and every limit here)."""
    ray: RayPoolSettings = field(default_factory=RayPoolSettings)
    """The pool of ``placement: ray``; only valid with it."""
    timeout_s: float = 10.0
    """Wall-clock limit per execution; the whole process tree is killed when it expires."""
    cpu_seconds: int = 10
    """RLIMIT_CPU of the executed code."""
    memory_mb: int = 2048
    """RLIMIT_AS (address space) of each process of the executed code, in MiB (the preloaded interpreter
    counts: ~140 MiB)."""
    file_size_mb: int = 16
    """RLIMIT_FSIZE: largest file the code may write, in MiB."""
    max_processes: int = 32
    """Most processes/threads one run may have alive: RLIMIT_NPROC of the run's own uid when the host runs
    as root. Without root the runs share the interpreter's uid, and so one count: ``max_processes`` times
    ``concurrency`` for all runs together (a run may use what the others leave; under ``limits``, with
    no user namespace, the user's other processes count too)."""
    tmp_size_mb: int = 1024
    """Size of each private, RAM-backed tmpfs (``/tmp``, holding every run's directory, and ``/dev/shm``)
    under bwrap and unshare: bounds what hostile code can write in total, where ``file_size_mb`` bounds
    one file."""
    max_output_chars: int = 8000
    """Characters of stdout+stderr shown to the model (head + tail with a marker when longer)."""
    return_figures: bool = False
    """Image files a run saves in its working directory (``plt.savefig("plot.png")``: PNG, JPEG, GIF or WebP;
    at most 4 of 4 MiB) come back to the model as images in the tool result: for a vision-language model
    (``false``: a text model never gets an image)."""
    concurrency: int | None = None
    """Executions running at once per event loop (a rollout process has one) with ``placement: local``;
    ``None`` means the number of CPUs. With ``placement: ray`` the pool bounds them (``ray.workers`` x
    ``ray.slots_per_worker``) and this must stay null."""
    prewarm: bool = True
    """Import ``preload_modules`` once in the interpreter every run is forked from (runs skip that import
    time); ``false``: each run imports what it uses."""
    preload_modules: tuple[str, ...] = ("numpy", "sympy")
    """Modules imported once in the warm interpreter so runs do not pay their import time."""

    def __post_init__(self) -> None:
        if self.backend not in SANDBOX_BACKENDS:
            raise SettingsError(
                f"sandbox.backend: unknown backend {self.backend!r} ({', '.join(SANDBOX_BACKENDS)})"
            )
        self._check_placement()
        for name in (
            "timeout_s",
            "cpu_seconds",
            "memory_mb",
            "file_size_mb",
            "tmp_size_mb",
            "max_processes",
            "max_output_chars",
        ):
            if getattr(self, name) <= 0:
                raise SettingsError(f"sandbox.{name} must be > 0, got {getattr(self, name)!r}")
        if self.concurrency is not None and self.concurrency <= 0:
            raise SettingsError(f"sandbox.concurrency must be > 0 or null, got {self.concurrency!r}")

    def _check_placement(self) -> None:
        if self.placement not in SANDBOX_PLACEMENTS:
            raise SettingsError(
                f"sandbox.placement: unknown placement {self.placement!r} ({', '.join(SANDBOX_PLACEMENTS)})"
            )
        if self.placement == "ray":
            if self.concurrency is not None:
                raise SettingsError(
                    "sandbox.concurrency bounds local runs; with sandbox.placement: ray the pool bounds them: set "
                    "sandbox.ray.workers and sandbox.ray.slots_per_worker instead"
                )
            return
        default = RayPoolSettings()
        changed = [
            f.name
            for f in dataclasses.fields(default)
            if getattr(self.ray, f.name) != getattr(default, f.name)
        ]
        if changed:
            raise SettingsError(
                f"sandbox.ray.{changed[0]} is set but sandbox.placement is {self.placement!r}: set "
                "sandbox.placement: ray, or remove the sandbox.ray section"
            )

    @property
    def effective_concurrency(self) -> int:
        """``concurrency``, or the number of CPUs when it is None (a local sandbox's bound)."""
        return self.concurrency or os.cpu_count() or 1

    def in_one_worker(self) -> SandboxSettings:
        """The settings of the sandbox one Ray sandbox worker hosts: this backend and every limit, run where
        the worker is, ``ray.slots_per_worker`` at once."""
        return dataclasses.replace(
            self, placement="local", ray=RayPoolSettings(), concurrency=self.ray.slots_per_worker
        )


@dataclass(frozen=True)
class CodeRewardSettings:
    """Limits and scoring of ``slime_strands.reward.code_reward``: the model's program against the row's tests,
    in the sandbox (``sandbox.backend`` and ``sandbox.placement`` with these limits of its own)."""

    timeout_s: float = 10.0
    """Wall-clock limit of one sample's grading (the program's start and every test); past it the sample scores 0."""
    memory_mb: int = 1024
    """RLIMIT_AS of each process of the graded program, in MiB."""
    max_processes: int = 16
    """Most processes / threads the graded program may have alive (as ``sandbox.max_processes``)."""
    max_output_chars: int = 16000
    """What the sandbox keeps of the grading run's own output (the verdict); the program's prints are not kept."""
    pass_fraction: bool = False
    """Where a row has several test cases (MBPP's asserts): the share of them that pass; false: 1.0 only when
    every one passes."""
    concurrency: int | None = None
    """Samples graded at once per event loop with ``sandbox.placement: local`` (None: the number of CPUs); with
    ``placement: ray`` the pool of ``sandbox.ray`` bounds them and this must stay null."""
    failure_lines: int = 12
    """Lines of the failing test's traceback kept in the sample's metadata (``code_reward``) for ``inspect``."""

    def __post_init__(self) -> None:
        for name in ("timeout_s", "memory_mb", "max_processes", "max_output_chars", "failure_lines"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"reward.code.{name} must be > 0, got {getattr(self, name)!r}")
        if self.concurrency is not None and self.concurrency <= 0:
            raise SettingsError(f"reward.code.concurrency must be > 0 or null, got {self.concurrency!r}")


@dataclass(frozen=True)
class RewardSettings:
    """Scoring rule knobs for ``slime_strands.reward.math_reward`` (and ``code`` for ``code_reward``)."""

    tool_shaping: bool = True
    """On failed answers in TRAINING, nudge the reward with the number of tool iterations (seeds' example):
    ``min(shaping_cap, score + (tool_iters - shaping_baseline_iters) * shaping_per_iter)``. Never in eval."""
    shaping_cap: float = -0.6
    shaping_per_iter: float = 0.05
    shaping_baseline_iters: int = 2
    correct: float = 1.0
    """Reward of a correct answer (training); eval always reports 1.0 / 0.0."""
    incorrect: float = -1.0
    """Reward of a wrong or missing answer (training) before shaping."""
    math_verify_timeout_s: float = 10.0
    """Wall-clock limit of the math-verify fallback for non-integer labels (separate process)."""
    code: CodeRewardSettings = field(default_factory=CodeRewardSettings)
    """``code_reward``'s sandbox limits and scoring."""
    kind: str = "math"
    """The environment's reward ``slime-strands eval`` grades with: ``math`` (``accuracy``) or ``code``
    (``code_reward``). Inside slime the reward is ``--custom-rm-path``'s."""

    def __post_init__(self) -> None:
        if self.math_verify_timeout_s <= 0:
            raise SettingsError("reward.math_verify_timeout_s must be > 0")
        if self.kind not in REWARD_KINDS:
            raise SettingsError(
                f"reward.kind: unknown reward {self.kind!r}{_did_you_mean(self.kind, REWARD_KINDS)}; "
                f"choose one of {', '.join(REWARD_KINDS)}"
            )


@dataclass(frozen=True)
class CompactionSettings:
    """When and how ``context_management`` rewrites a long episode's history (see ``slime_strands.agent.compaction``).

    Each rewrite closes the episode's current trajectory segment and starts a new one from the re-rendered,
    compacted conversation; every segment becomes its own slime sample.
    """

    trigger_share: float = 0.8
    """Compact before a model call once the segment holds this share of the context window, or its response
    this share of the response budget (exact token counts). A turn that does not fit compacts too."""
    max_compactions: int = 4
    """Most compactions per episode; after that the episode ends as without compaction (``context_full`` /
    ``response_budget``). It bounds the episode at ``max_compactions + 1`` samples."""
    window_size: int = 8
    """``sliding_window``: the most recent messages kept after the task (moved back to keep a tool call with
    its result). ``summarize`` keeps as many when a summary cannot be used (see ``summary_max_tokens``)."""
    summary_prompt: str = DEFAULT_SUMMARY_PROMPT
    """``summarize``: the user message asking the policy for the summary, appended to the segment being
    closed (the summary is a trained turn of that segment)."""
    summary_ratio: float = 1.0
    """``summarize``: share of the messages after the task that the summary replaces, oldest first (moved
    forward so a tool result keeps its call); the rest stays verbatim after the summary."""
    summary_max_tokens: int | None = None
    """``summarize``: the summary's ``max_new_tokens``, and the room every segment keeps free for it (with the
    summary request) so a summary always fits. None: 1024, or a sixteenth of the context window or of the
    response budget when that is smaller. A summary is asked only where all of it fits, and a summary cut at
    this length is never used: the compaction then keeps the newest ``window_size`` messages instead."""

    def __post_init__(self) -> None:
        if not 0 < self.trigger_share <= 1:
            raise SettingsError(f"compaction.trigger_share must be in (0, 1], got {self.trigger_share!r}")
        if not 0 < self.summary_ratio <= 1:
            raise SettingsError(f"compaction.summary_ratio must be in (0, 1], got {self.summary_ratio!r}")
        if self.max_compactions < 1:
            raise SettingsError(f"compaction.max_compactions must be >= 1, got {self.max_compactions!r}")
        if self.window_size < 1:
            raise SettingsError(f"compaction.window_size must be >= 1, got {self.window_size!r}")
        if not self.summary_prompt.strip():
            raise SettingsError("compaction.summary_prompt must not be empty")
        if self.summary_max_tokens is not None and self.summary_max_tokens < 1:
            raise SettingsError(
                f"compaction.summary_max_tokens must be >= 1 or null, got {self.summary_max_tokens!r}"
            )


STALENESS_ACTIONS = ("mask", "drop")
"""Values of ``staleness.on_exceed``."""


@dataclass(frozen=True)
class StalenessSettings:
    """How old a trained token may be, in weight versions (see ``slime_strands._slime.staleness``).

    An episode slime aborts at a weight update and continues afterwards (``--partial-rollout``, the fully-async
    rollout) holds tokens of several policies; a token's version is the ``weight_version`` of the server answer
    it came in, and "the newest" is the newest version the episode saw."""

    max_versions: int | None = None
    """None: no bound. K: tokens from more than K versions before the newest are not trained (K = 0 trains
    only the newest version's tokens, as ``--mask-offpolicy-in-partial-rollout`` does)."""
    on_exceed: str = "mask"
    """``mask``: those tokens get loss mask 0 and stay in the context (a sample left with no trained token is
    removed from training); ``drop``: an episode whose trained tokens span more than K versions ends FAILED
    (left out of its group)."""

    def __post_init__(self) -> None:
        if self.max_versions is not None and self.max_versions < 0:
            raise SettingsError(f"staleness.max_versions must be >= 0 or null, got {self.max_versions!r}")
        if self.on_exceed not in STALENESS_ACTIONS:
            raise SettingsError(
                f"staleness.on_exceed: unknown value {self.on_exceed!r}; choose one of {STALENESS_ACTIONS}"
            )

    @property
    def masks(self) -> bool:
        """Whether the bound masks stale tokens (a bound is set and ``on_exceed`` is ``mask``)."""
        return self.max_versions is not None and self.on_exceed == "mask"

    @property
    def drops(self) -> bool:
        """Whether the bound fails episodes that outlive it (a bound is set and ``on_exceed`` is ``drop``)."""
        return self.max_versions is not None and self.on_exceed == "drop"


# The compaction knobs that only one strategy reads.
_STRATEGY_KNOBS = {
    "summary_prompt": "summarize",
    "summary_ratio": "summarize",
    "summary_max_tokens": "summarize",
}


MCP_TRANSPORTS = ("stdio", "streamable_http")
"""Values of ``McpServerSettings.transport``: how the plugin reaches an MCP server."""
MCP_SCOPES = ("shared", "episode")
"""Values of ``McpServerSettings.scope``: one session for every episode of a process, or one per episode."""
_PREFIX_FROM_NAME = "<name>"
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class McpServerSettings:
    """One MCP server whose tools the agent gets (``slime_strands.mcp_tools`` runs it)."""

    name: str = ""
    """What the server is called in messages, and (by default) the prefix of its tools' names."""
    transport: str = "stdio"
    """``stdio``: the plugin starts ``command`` and speaks MCP over its stdin/stdout; ``streamable_http``: the
    plugin connects to ``url`` (a server someone else runs)."""
    command: str | None = None
    """stdio: the program to start (``python``, ``npx``, ...)."""
    args: tuple[str, ...] = ()
    """stdio: its arguments."""
    env: dict[str, str] | None = None
    """stdio: environment variables set for it, over the mcp package's minimal default environment (``HOME``,
    ``PATH``, ``USER``, ...; the plugin's own environment is NOT inherited)."""
    cwd: str | None = None
    """stdio: its working directory (null: this process's)."""
    url: str | None = None
    """streamable_http: the server's MCP endpoint (``http://host:port/mcp``)."""
    headers: dict[str, str] | None = None
    """streamable_http: headers sent with every request (an ``Authorization``, ...)."""
    scope: str = "shared"
    """``shared``: one session per process, opened at the first sample, its calls multiplexed, closed when the
    process ends. ``episode``: a fresh server process (stdio) or MCP session (HTTP, its own session id) per
    episode, started before its first turn and stopped however it ends."""
    tools: tuple[str, ...] | None = None
    """The MCP tool names the agent gets (each must be listed by the server); null: every tool it lists."""
    prefix: str | None = _PREFIX_FROM_NAME
    """Tools are offered as ``<prefix>_<tool>``; by default the prefix is ``name``; null keeps the MCP names."""
    call_timeout_s: float = 60.0
    """A call without an answer after this long is a tool error the model sees (the episode goes on)."""
    startup_timeout_s: float = 30.0
    """How long a server may take to start and answer MCP's initialize."""
    max_live: int = 64
    """``scope: episode``: most of this server's sessions (stdio: processes) alive at once in a process; more
    episodes wait for one to end before they start."""

    def __post_init__(self) -> None:
        where = f"mcp_servers[{self.name or '?'}]"
        if not _TOOL_NAME.match(self.name):
            raise SettingsError(
                f"mcp_servers: every server needs a name of letters, digits, '_' or '-' (got {self.name!r})"
            )
        if self.transport not in MCP_TRANSPORTS:
            raise SettingsError(
                f"{where}.transport: unknown transport {self.transport!r}"
                f"{_did_you_mean(self.transport, MCP_TRANSPORTS)}; choose one of {MCP_TRANSPORTS}"
            )
        if self.scope not in MCP_SCOPES:
            raise SettingsError(
                f"{where}.scope: unknown scope {self.scope!r}{_did_you_mean(self.scope, MCP_SCOPES)}; "
                f"choose one of {MCP_SCOPES}"
            )
        self._check_transport(where)
        if self.tools is not None and (
            not self.tools or len(set(self.tools)) != len(self.tools) or not all(self.tools)
        ):
            raise SettingsError(
                f"{where}.tools: a list of distinct MCP tool names, or null for every tool the server lists"
            )
        if self.prefix == _PREFIX_FROM_NAME:
            object.__setattr__(self, "prefix", self.name)
        if self.prefix is not None and not _TOOL_NAME.match(self.prefix):
            raise SettingsError(f"{where}.prefix: letters, digits, '_' or '-', or null (got {self.prefix!r})")
        for name in ("call_timeout_s", "startup_timeout_s", "max_live"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{where}.{name} must be > 0, got {getattr(self, name)!r}")
        if self.scope == "shared" and self.max_live != 64:
            raise SettingsError(
                f"{where}.max_live bounds episode-scope servers: set scope: episode or remove it"
            )

    def _check_transport(self, where: str) -> None:
        stdio = {"command": self.command, "args": self.args, "env": self.env, "cwd": self.cwd}
        http = {"url": self.url, "headers": self.headers}
        own, other = (stdio, http) if self.transport == "stdio" else (http, stdio)
        wrong = next((key for key, value in other.items() if value), None)
        if wrong is not None:
            raise SettingsError(f"{where}.{wrong} does not apply to transport: {self.transport}")
        needed = "command" if self.transport == "stdio" else "url"
        if not own[needed]:
            raise SettingsError(f"{where}: transport {self.transport} needs {needed}")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise SettingsError(f"{where}.url must start with http:// or https:// (got {self.url!r})")


@dataclass(frozen=True)
class RolloutWorkersSettings:
    """Where agent episodes run: in slime's process (``count: 0``), or on a pool of Ray actors ("rollout
    workers") spread over the cluster, each running its share of the episodes on its own event loop (one
    process's loop carries ~500 agent turns/s: docs/slime.md says when to turn it on)."""

    count: int = 0
    """Rollout workers (Ray actors, SPREAD over the nodes, CPU only); 0 runs every episode in slime's process."""
    custom_resource: str | None = None
    """A custom Ray resource each worker needs one unit of (only nodes started with it host workers)."""
    max_in_flight: int | None = None
    """Episodes one worker runs at once; null: slime's concurrency (the router's pool) / ``count``."""
    cpus_per_worker: float = 1.0
    """Ray CPUs each worker reserves."""
    max_waiting: int = 100_000
    """Episodes that may wait for a free worker; one more ends FAILED at once (memory stays bounded)."""
    start_timeout_s: float = 180.0
    """How long the first sample waits for the workers to start before it stops the run."""

    def __post_init__(self) -> None:
        if self.count < 0:
            raise SettingsError(f"rollout_workers.count must be >= 0, got {self.count!r}")
        if self.max_in_flight is not None and self.max_in_flight <= 0:
            raise SettingsError(
                f"rollout_workers.max_in_flight must be > 0 or null, got {self.max_in_flight!r}"
            )
        for name in ("max_waiting", "start_timeout_s"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"rollout_workers.{name} must be > 0, got {getattr(self, name)!r}")
        if self.cpus_per_worker < 0:
            raise SettingsError(f"rollout_workers.cpus_per_worker must be >= 0, got {self.cpus_per_worker!r}")
        if self.custom_resource is not None and not self.custom_resource.strip():
            raise SettingsError("rollout_workers.custom_resource must be a resource name or null")


@dataclass(frozen=True)
class PluginSettings:
    """Everything the rollout plugin can be told; defaults give the seeds' math agent."""

    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    """Used unless the sample's own chat messages start with a system message."""
    tools: tuple[str, ...] = ("slime_strands.sandbox.execute_python_code",)
    """Dotted paths of Strands tools given to the agent."""
    tool_parser: str = "auto"
    """``auto`` (chosen from the tokenizer's chat template and special tokens) or a parser named as SGLang's
    ``--tool-call-parser`` values: ``hermes``, ``qwen3_coder``, ``glm45``, ``glm47``, ``kimi_k2``,
    ``deepseekv31``, ``llama3`` (or one added with ``register_tool_parser`` before the settings load)."""
    enable_thinking: bool | None = None
    """Passed to the chat template; ``None`` keeps the template's default."""
    max_tool_iters: int | None = 5
    """Most assistant turns with tool calls (parallel calls of one turn count once); None = unlimited."""
    max_tool_calls: int | None = None
    """Most tool calls in total; None = unlimited."""
    max_tool_output_tokens: int = 4096
    """A single tool result longer than this (in tokens) is cut to head + tail with a marker."""
    max_calls_per_turn: int | None = 16
    """Tool calls of one assistant turn that run; the rest get one error result. None = unlimited."""
    tool_rounds_per_invocation: int | None = DEFAULT_TOOL_ROUNDS_PER_INVOCATION
    """Tool rounds per Strands invocation: after that many the agent is invoked again with no prompt (the
    trajectory is unchanged; hooks see one invocation per stretch). Strands nests each round of an invocation
    one level deeper: its cost per turn grows with them, and ~245 rounds (~320 on Python 3.11) pass Python's recursion limit.
    None = the whole episode in one invocation."""
    max_context_len: int | None = None
    """Most tokens a trajectory may hold; None = ``--rollout-max-context-len`` (``--eval-max-context-len`` in
    eval). The server's window (``/v1/models``) less SGLang's margin always bounds it too."""
    request_timeout_s: float | None = None
    """Per-request HTTP timeout towards SGLang; None waits as long as the server needs (slime's choice)."""
    max_retries: int = 60
    """Retries of transient failures (connection errors, 5xx, 408, 429) per request."""
    server_abort_retries: int = 3
    """Times a turn is sent again when the server aborts it although slime did not abort (a worker restart
    behind the router); then the sample is FAILED with the server's reason."""
    retry_delay_s: float = 1.0
    """Base of the exponential backoff between retries (capped at 8x this)."""
    sandbox: SandboxSettings = field(default_factory=SandboxSettings)
    reward: RewardSettings = field(default_factory=RewardSettings)
    context_management: str = "none"
    """``none`` (the history is append-only: an episode that outgrows the window ends ``context_full``),
    ``summarize`` (the policy summarises the history, which is replaced by the summary) or ``sliding_window``
    (the oldest messages are dropped). Each rewrite starts a new trajectory segment: ``generate`` then returns
    ``list[Sample]`` sharing one ``rollout_id``."""
    compaction: CompactionSettings = field(default_factory=CompactionSettings)
    """Knobs of ``context_management``; only valid when it is not ``none``."""
    collect_subagents: bool = False
    """Train sub-agents run by tools built with ``slime_strands.subagents.subagent_tool``: each sub-agent's
    trajectory becomes a sibling sample of the episode (``generate`` then returns ``list[Sample]``)."""
    resume_aborted: bool = True
    """slime's ``--partial-rollout``: an episode the abort stopped continues where it stopped when slime hands
    its sample back (its conversation, token trajectory, the turn it was generating and its counters are
    kept on the sample); false starts it again from the prompt."""
    staleness: StalenessSettings = field(default_factory=StalenessSettings)
    """The bound on how many weight versions old a trained token may be (partial / fully-async rollout)."""
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    """SGLang sampling params sent with every turn (``regex``, ``json_schema``, ``ebnf``, ``structural_tag``,
    ``top_k``, ``min_p``, ``stop``, ``logit_bias``, ...; keys SGLang does not accept are refused, naming the
    key). They win over slime's (``slime_strands.provider.sampling`` says how they merge): ``max_new_tokens`` here caps
    each turn (slime's stays the whole trajectory's budget), and in training ``temperature`` / ``top_p`` must
    equal slime's ``--rollout-temperature`` / ``--rollout-top-p`` (its trainer uses them)."""
    mcp_servers: tuple[McpServerSettings, ...] = ()
    """MCP servers whose tools the agent gets besides ``tools`` (see ``McpServerSettings``; docs/mcp.md)."""
    gc_young_threshold: int | None = 100_000
    """Allocations between two young garbage collections (Python's generation-0 threshold, 700 by default):
    raised to this when an episode starts, never lowered; null leaves the process's collector alone. Strands
    copies every conversation twice per model call, so at hundreds of agents per process the default makes
    garbage collection over a third of the client's CPU (docs/performance.md, "Garbage collection")."""
    rollout_workers: RolloutWorkersSettings = field(default_factory=RolloutWorkersSettings)
    """Where episodes run: slime's process (the default) or a Ray pool of rollout workers."""

    @property
    def fans_out(self) -> bool:
        """Whether an episode may produce several samples (compaction or collected sub-agents)."""
        return self.context_management != "none" or self.collect_subagents

    def __post_init__(self) -> None:
        for name in ("max_tool_iters", "max_tool_calls", "max_context_len", "max_calls_per_turn"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise SettingsError(f"{name} must be >= 0 or null, got {value!r}")
        if self.tool_rounds_per_invocation is not None and self.tool_rounds_per_invocation < 1:
            raise SettingsError(
                f"tool_rounds_per_invocation must be >= 1 or null, got {self.tool_rounds_per_invocation!r}"
            )
        if self.max_tool_output_tokens <= 0:
            raise SettingsError("max_tool_output_tokens must be > 0")
        if self.tool_parser != AUTO and self.tool_parser not in registered_tool_parsers():
            raise SettingsError(
                f"tool_parser: unknown parser {self.tool_parser!r}; choose {AUTO!r} or one of "
                f"{registered_tool_parsers()}"
            )
        if self.gc_young_threshold is not None and self.gc_young_threshold <= 0:
            raise SettingsError(f"gc_young_threshold must be > 0 or null, got {self.gc_young_threshold!r}")
        if self.server_abort_retries < 0:
            raise SettingsError(f"server_abort_retries must be >= 0, got {self.server_abort_retries!r}")
        self._check_context_management()
        if self.sandbox.placement == "ray" and self.reward.code.concurrency is not None:
            raise SettingsError(
                "reward.code.concurrency bounds local grading; with sandbox.placement: ray the pool bounds it: "
                "remove reward.code.concurrency (sandbox.ray sizes the pool)"
            )
        names = [server.name for server in self.mcp_servers]
        if len(set(names)) != len(names):
            twice = next(name for name in names if names.count(name) > 1)
            raise SettingsError(f"mcp_servers: two servers are named {twice!r}: give each its own name")

    def _check_context_management(self) -> None:
        if self.context_management not in CONTEXT_MANAGEMENT:
            raise SettingsError(
                f"context_management: unknown value {self.context_management!r}; choose one of {CONTEXT_MANAGEMENT}"
            )
        default = CompactionSettings()
        changed = [
            f.name
            for f in dataclasses.fields(default)
            if getattr(self.compaction, f.name) != getattr(default, f.name)
        ]
        if changed and self.context_management == "none":
            raise SettingsError(
                f"compaction.{changed[0]} is set but context_management is 'none': set context_management to "
                "'summarize' or 'sliding_window', or remove the compaction section"
            )
        for name in changed:
            strategy = _STRATEGY_KNOBS.get(name)
            if strategy is not None and strategy != self.context_management:
                raise SettingsError(
                    f"compaction.{name} only applies to context_management: {strategy} "
                    f"(it is {self.context_management!r})"
                )

    @property
    def retry_policy(self) -> RetryPolicy:
        """How the client tries requests again (``max_retries``, ``retry_delay_s``, ``server_abort_retries``):
        the one place the plugin builds it."""
        return RetryPolicy(
            max_retries=self.max_retries, delay_s=self.retry_delay_s, abort_resends=self.server_abort_retries
        )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> PluginSettings:
        """Build from a plain mapping (e.g. the ``strands:`` YAML section), validating every key."""
        return _build(cls, data or {}, prefix="")

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str], *, other_keys: bool = True) -> PluginSettings:
        """Load a ``--custom-config-path`` style YAML file and read its ``strands:`` section.

        ``other_keys``: whether top-level keys besides ``strands`` may be there (slime copies them onto its
        ``args``, for slime or another plugin); False for the plugin's own file (``slime-strands eval
        --config``, ``validate-config``), where any other key is a mistake. A near-miss of ``strands`` is an
        error either way: its settings would be ignored."""
        text = Path(path).read_text()
        try:
            doc = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise SettingsError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from exc
        if not isinstance(doc, Mapping):
            raise SettingsError(f"{path}: expected a mapping at top level")
        wrong = [key for key in doc if key != ARGS_KEY and (not other_keys or _near_miss(key))]
        if wrong:
            raise SettingsError(f"{path}: unknown top-level key {wrong[0]!r}: {_top_level_advice(wrong[0])}")
        return cls.from_mapping(doc.get(ARGS_KEY))


def settings_from_slime(data: Any, attributes: Iterable[Any] = ()) -> PluginSettings:
    """The plugin settings slime holds: ``data`` is its ``strands`` attribute (a mapping, settings, or None for
    the defaults), ``attributes`` the names of every attribute of slime's args.

    slime copies every top-level key of ``--custom-config-path`` onto its args (keys for slime and other
    plugins among them), so only a near-miss of ``strands`` among ``attributes`` is refused: its settings would
    be ignored. (``slime_strands._slime.config`` reads slime's args.)"""
    if isinstance(data, PluginSettings):
        return data
    misspelt = [name for name in attributes if _near_miss(name)]
    if misspelt:
        raise SettingsError(
            f"slime's args have {misspelt[0]!r} (a top-level key of --custom-config-path?): did you mean "
            f"{ARGS_KEY!r}? slime-strands reads only {ARGS_KEY!r}, so the settings under {misspelt[0]!r} would "
            "be ignored"
        )
    return PluginSettings.from_mapping(data)


def _top_level_advice(key: Any) -> str:
    """What to do about a top-level key of the plugin's settings file other than ``strands``."""
    if _near_miss(key):
        return f"did you mean {ARGS_KEY!r}?"
    if key in {f.name for f in dataclasses.fields(PluginSettings)}:
        return f"it is a plugin setting: indent it under {ARGS_KEY}:"
    if key == "eval":
        return (
            "this is slime's --eval-config (the datasets slime evaluates, as configs/eval_aime.yaml), not the "
            f"plugin's settings file (a {ARGS_KEY}: section, as configs/strands_math.yaml): slime-strands eval "
            "takes the plugin's settings with --config and the prompts with --data"
        )
    return f"the plugin's settings file holds only a {ARGS_KEY}: section"


def _did_you_mean(name: Any, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest known name, or nothing when none is close."""
    close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _near_miss(name: Any) -> bool:
    """A spelling of ``strands`` other than itself, one edit away with case, ``-`` and ``_`` aside:
    ``Strands``, ``strand``, ``stands``, ``strnads``, ``strands_``."""
    if not isinstance(name, str) or name == ARGS_KEY:
        return False
    a, b = name.lower().replace("-", "_"), ARGS_KEY
    if a == b or a.strip("_") == b:
        return True
    if len(a) == len(b):
        diffs = [i for i in range(len(a)) if a[i] != b[i]]
        swapped = len(diffs) == 2 and diffs[1] == diffs[0] + 1 and a[diffs[0]] == b[diffs[1]]
        return len(diffs) == 1 or (swapped and a[diffs[1]] == b[diffs[0]])
    short, long = sorted((a, b), key=len)
    return len(long) - len(short) == 1 and any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def _build(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    """``cls`` (a settings dataclass) from a mapping; ``prefix`` names where it sits (``sandbox.``)."""
    if not isinstance(data, Mapping):
        where = prefix.rstrip(".") or "settings"
        raise SettingsError(f"{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields), key=str)
    if unknown:
        named = ", ".join(prefix + str(k) + _did_you_mean(k, fields) for k in unknown)
        raise SettingsError(f"unknown setting(s) {named}; known: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {name: _coerce(hints[name], value, prefix + name) for name, value in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:  # pragma: no cover - guarded by the checks above
        raise SettingsError(str(exc)) from exc


def _coerce(hint: Any, value: Any, where: str) -> Any:
    """Check ``value`` against a field's type hint, converting lists to tuples and ints to floats."""
    if hint is SamplingParams:
        try:
            return value if isinstance(value, SamplingParams) else SamplingParams(value, where=where)
        except SamplingParamError as exc:
            raise SettingsError(str(exc)) from None
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _build(hint, {} if value is None else value, prefix=where + ".")
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(option, value, where)
            except SettingsError as exc:
                errors.append(str(exc))
        raise SettingsError(errors[0] if errors else f"{where}: invalid value {value!r}")
    if origin is dict:
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise SettingsError(f"{where}: expected a mapping of strings to strings, got {value!r}")
        return dict(value)
    if origin is tuple:
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise SettingsError(f"{where}: expected a list, got {value!r}")
        (item,) = typing.get_args(hint)[:1]
        return tuple(_coerce(item, v, where) for v in value)
    if hint is float and is_int(value):
        return float(value)
    if hint in (int, float) and isinstance(value, bool):
        raise SettingsError(f"{where}: expected {hint.__name__}, got a boolean")
    if isinstance(hint, type) and not isinstance(value, hint):
        raise SettingsError(f"{where}: expected {hint.__name__}, got {type(value).__name__} {value!r}")
    return value
