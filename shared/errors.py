"""Errors a user can cause. The command line turns them into one line and exit 2."""

from __future__ import annotations

__all__ = ["UserError"]


class UserError(Exception):
    """Bad arguments, unreadable or malformed input: the message says what to fix."""
