"""The requests of one trajectory's turns: the trajectory as request JSON, every attempt's id kept for an
abort, and the race against the episode's abort signal.

Every turn sends the WHOLE trajectory as ``input_ids``: it is kept as the JSON text SGLang receives
(:class:`~slime_strands.provider.client.TokenIdsJSON`), extended with each turn's tokens, so each token is
serialised once. SGLang matches abort ids by prefix, so a trajectory's attempts are aborted by their exact ids
(:class:`~slime_strands.provider.client.RequestHandle`): a shared id would reach other trajectories' requests.
When the turn's ``abort_signal`` is an :class:`~slime_strands.provider.abort_signal.AbortSignal` (an episode's
abort flag), the moment it holds the request in flight is aborted so: the turn ends at once with the tokens
written so far, whether or not anyone aborts the whole server (slime does, but a router between may keep a
request it sent late), and no attempt of it is sent after that.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from .abort_signal import AbortSignal
from .client import GenerateResult, RequestHandle, SGLangClient, SGLangError, TokenIdsJSON
from .offload import offload
from .token_manager import TokenManager

__all__ = ["TurnRequests"]

logger = logging.getLogger(__name__)


class TurnRequests:
    """What goes to the server for one trajectory (see the module docstring); :meth:`reset` for a new episode."""

    def __init__(self, client: SGLangClient) -> None:
        self._client = client
        self.handle = RequestHandle()
        """The ids of this trajectory's request in flight (every attempt), for :meth:`abort`."""
        self.trajectory = TokenIdsJSON()
        """The trajectory as request JSON, extended with it: every token is serialised once."""
        self._trajectory_of: TokenManager | None = None

    def reset(self) -> None:
        """A new episode: nothing in flight, no abort remembered, no trajectory."""
        self.handle = RequestHandle()
        self.trajectory = TokenIdsJSON()
        self._trajectory_of = None

    async def follow(self, tm: TokenManager) -> None:
        """Serialise ``tm`` once (its wire ids: each image one pad) when it is not the trajectory kept (a new
        episode or segment, or a token manager changed behind the model's back)."""
        if self._trajectory_of is not tm or len(self.trajectory) != tm.wire_length:
            self.trajectory = await offload(len(tm) * 4, TokenIdsJSON, tm.wire_ids())
            self._trajectory_of = tm

    def extend(self, token_ids: Sequence[int] | TokenIdsJSON) -> None:
        """Tokens appended to the trajectory (a turn's input once accepted, its output)."""
        self.trajectory.extend(token_ids)

    async def abort(self) -> None:
        """Abort the request in flight, every attempt of it by its exact id; until :meth:`reset`, no request is
        sent and a turn ends as aborted."""
        await self._client.abort(self.handle)

    async def generate(
        self,
        params: dict[str, Any],
        tail: TokenIdsJSON,
        *,
        abort_signal: Callable[[], bool] | None,
        **kwargs: Any,
    ) -> GenerateResult:
        """``client.generate`` of the trajectory followed by ``tail``, raced against ``abort_signal`` when it is
        an :class:`AbortSignal` (see the module docstring)."""
        answer = self._client.generate(
            self.trajectory,
            params,
            input_ids_tail=tail,
            handle=self.handle,
            abort_signal=abort_signal,
            **kwargs,
        )
        if not isinstance(abort_signal, AbortSignal):
            return await answer
        sending = asyncio.ensure_future(answer)
        aborting = asyncio.ensure_future(abort_signal.wait())
        try:
            await asyncio.wait({sending, aborting}, return_when=asyncio.FIRST_COMPLETED)
            if not sending.done():
                try:
                    await self.abort()
                except SGLangError as exc:  # slime's abort of every worker still ends it
                    logger.debug("slime-strands: aborting request(s) %s failed: %s", self.handle.rids, exc)
            return await sending
        finally:
            aborting.cancel()
            sending.cancel()
