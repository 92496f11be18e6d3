"""slime-strands: token-in/token-out Strands Agents rollouts on SGLang for agentic RL with slime.

Public API::

    from slime_strands import SGLangClient, SGLangModel, TokenManager, ToolLimiter, ToolIterationLimiter
    from slime_strands import build_agent, run_agent  # the agent as the plugin builds and runs it (the fast path)
    from slime_strands import load_tokenizer  # a checkpoint folder, a hub id, or "qwen3-demo" (the demo server's)
    from slime_strands.tool_parsers import HermesToolParser

slime's entry points live in ``slime_strands.rollout`` (generate), ``slime_strands.reward`` and
``slime_strands.metrics``; they import slime lazily (it is not on PyPI). Importing the package drops
transformers' "PyTorch was not found" notice (tokenizers never need PyTorch) when transformers is imported after
it, as ``load_tokenizer`` does.
"""

from .agent.episode import build_agent, run_agent
from .agent.limits import ToolIterationLimiter, ToolLimiter
from .errors import ConfigurationError, SlimeStrandsError
from .provider.client import (
    GenerateResult,
    SGLangAbortError,
    SGLangClient,
    SGLangConnectionError,
    SGLangContextLengthError,
    SGLangError,
    SGLangHTTPError,
    SGLangProtocolError,
    SGLangTimeoutError,
)
from .provider.model import GenerationAbortedError, ResponseBudgetExhaustedError, SGLangModel, TrajectoryError
from .provider.token_manager import Segment, Span, TokenManager, TurnInfo
from .template.tokenizer_loading import load_tokenizer, quiet_torch_notice

__all__ = [
    "ConfigurationError",
    "GenerateResult",
    "GenerationAbortedError",
    "ResponseBudgetExhaustedError",
    "SGLangAbortError",
    "SGLangClient",
    "SGLangConnectionError",
    "SGLangContextLengthError",
    "SGLangError",
    "SGLangHTTPError",
    "SGLangModel",
    "SGLangProtocolError",
    "SGLangTimeoutError",
    "Segment",
    "SlimeStrandsError",
    "Span",
    "TokenManager",
    "ToolIterationLimiter",
    "ToolLimiter",
    "TrajectoryError",
    "TurnInfo",
    "build_agent",
    "load_tokenizer",
    "run_agent",
]
__version__ = "0.1.0"

quiet_torch_notice()
