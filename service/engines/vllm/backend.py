"""Where vLLM runs, seen from the engine adapter: the backend protocol and the values
that cross it (a leaf module, so that the adapter and both backends import it, not each other)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncGenerator, Protocol


@dataclass(frozen=True)
class Sampling:
    """The sampling options a backend passes to vLLM."""

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None


@dataclass(frozen=True)
class Chunk:
    """New output tokens of one request; ``finish_reason`` on the last chunk only."""

    token_ids: tuple[int, ...]
    finish_reason: str | None = None


class Backend(Protocol):
    model_name: str
    sends_key_material: bool
    """True: the key travels sealed (in-process); False: only its id (remote)."""

    @property
    def ready(self) -> bool: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def stream(self, request_id: str, prompt_ids: tuple[int, ...], sampling: Sampling,
               extra_args: dict[str, Any]) -> AsyncGenerator[Chunk, None]:
        """The request's output; closing the generator aborts the request in vLLM."""
        ...
