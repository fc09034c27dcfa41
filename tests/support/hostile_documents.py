"""Hostile documents shared by the document and entry-point tests."""

from __future__ import annotations

# "billion laughs": 9 levels of 9 aliases each, ~300 bytes that expand to 9**9 values
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True))
