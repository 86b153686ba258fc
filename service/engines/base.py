"""The engine interface the gateway drives, whatever runs the model.

An engine takes a :class:`GenerationRequest` (token ids in, sampling parameters, and the
watermark the *server* chose for the request's tenant) and yields :class:`Delta` events
while it generates, then one :class:`Finished` event. Closing the iterator early (the
client went away) cancels the request inside the engine.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import AsyncIterator, Protocol, Union

from watermark.key import WatermarkKey


@dataclass(frozen=True)
class WatermarkPlan:
    """The key a request is watermarked with (never from the client)."""

    key: WatermarkKey = field(repr=False)
    key_id: str
    version: int
    fingerprint: str


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    watermark: WatermarkPlan | None = None
    """None: generate without a watermark (an allowed opt-out)."""


@dataclass(frozen=True)
class RouteCounts:
    """How the output tokens were drawn."""

    key_a: int = 0  # the single key of `gumbel`, or key A
    key_b: int = 0
    plain: int = 0  # repeated context or opt-out: ordinary sampling
    greedy: int = 0  # temperature 0

    @property
    def watermarked(self) -> int:
        return self.key_a + self.key_b

    @property
    def total(self) -> int:
        return self.key_a + self.key_b + self.plain + self.greedy


@dataclass(frozen=True)
class Delta:
    text: str
    token_ids: tuple[int, ...]
    routes: RouteCounts | None = None
    """Cumulative counts so far (lets a caller record a stream the client abandoned)."""


@dataclass(frozen=True)
class Finished:
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str  # "stop" (stop string or EOS), "length", "cancelled"
    prompt_tokens: int
    routes: RouteCounts
    drafted_tokens: int = 0
    accepted_tokens: int = 0


Event = Union[Delta, Finished]


class EngineBusy(Exception):
    """The engine's queue is full; the caller should retry later (HTTP 503)."""


class EngineFailure(Exception):
    """The engine failed while running the request (HTTP 503)."""


class Engine(Protocol):
    name: str
    model_name: str

    @property
    def ready(self) -> bool: ...

    def tokenizer(self): ...

    def check(self, request: GenerationRequest) -> None:
        """Raise ValueError (with a message) for a request the engine cannot serve."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[Event]: ...


async def finished(engine: Engine, request: GenerationRequest) -> Finished | None:
    """The request's Finished event, its Deltas consumed (None if the stream ends without one)."""
    async for event in engine.generate(request):
        if isinstance(event, Finished):
            return event
    return None


async def finish_all(engine: Engine, requests: list[GenerationRequest]) -> list[Finished]:
    """Every request run to its end at once (one batch, as concurrent clients would), in order."""
    return list(await asyncio.gather(*(finished(engine, r) for r in requests)))
