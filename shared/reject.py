"""`Reject`: how pure logic refuses a message without knowing about the bus."""

from __future__ import annotations

__all__ = ["Reject"]


class Reject(Exception):
    """Raised by a handler: the record goes to the dead-letter topic with `reason`.

    `kind` is a short label for metrics (e.g. "invalid", "duplicate"); `key` the
    job id or other key to file the rejection under, when known.
    """

    def __init__(self, reason: str, key: str = "", kind: str = "invalid") -> None:
        super().__init__(reason)
        self.reason = reason
        self.key = key
        self.kind = kind
