"""Identifiers: random, prefixed ids for responses, items and records."""

from __future__ import annotations

import secrets

__all__ = ["new_id"]


def new_id(prefix: str) -> str:
    """A fresh id such as ``resp_<32 hex digits>`` (128 random bits)."""
    return f"{prefix}_{secrets.token_hex(16)}"
