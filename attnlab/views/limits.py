"""What one explorer request may ask, and the refusal of one that asks otherwise."""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.errors import UsageError


@dataclass(frozen=True)
class Limits:
    """What one request may ask: characters of input, bytes of body, beam size, new tokens."""

    max_chars: int = 1000
    max_body: int = 64 * 1024
    max_beam: int = 16
    max_new_tokens: int = 200


LIMITS = Limits()


class Refused(UsageError):
    """A request the explorer will not answer; ``status`` is its HTTP status (400, 403, 413)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
