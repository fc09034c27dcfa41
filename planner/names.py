"""Names that end up as file names, host names or shell words (node names, run ids).

A node's name becomes its launch script's file name (``launch/RUN/NODE.sh``), a Slurm host match
and a word in generated bash; a run id becomes a folder and a rendezvous id. Such names are kept to
``[A-Za-z0-9][A-Za-z0-9._-]*`` (at most 128 characters): no ``/``, no ``..`` at the start, no
quotes, spaces or ``$`` — nothing a shell or a path could read as more than one plain word.
"""

from __future__ import annotations

import re

from planner.errors import SpecError

MAX_NAME = 128
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9._-]+")


def is_safe_name(value: str) -> bool:
    return len(value) <= MAX_NAME and _SAFE.fullmatch(value) is not None


def check_name(value: str, path: str, what: str = "name") -> str:
    """``value`` itself, or a ``SpecError`` at ``path`` saying which characters are allowed."""
    if not is_safe_name(value):
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise SpecError(path, f"{what} {shown!r} is not a plain name",
                        f"use letters, digits, '.', '-' and '_' (starting with a letter or digit, "
                        f"at most {MAX_NAME} characters)")
    return value


MAX_TEXT = 200


def check_label(value: str, path: str, what: str = "name") -> str:
    """``value`` itself, or a ``SpecError`` at ``path``: a free-text name (a model's, a cluster's)
    is printed in tables and titles and written into checkpoints, so it holds no control characters
    (a NUL, an escape sequence that clears the terminal, a line break) and at most ``MAX_TEXT``
    characters; spaces and any printable letter are fine."""
    bad = next((c for c in value if not c.isprintable() and c != " "), None)
    if bad is not None:
        raise SpecError(path, f"{what} holds the control character {bad!r} at position {value.index(bad)}",
                        "write the name with printable characters only")
    if len(value) > MAX_TEXT:
        raise SpecError(path, f"{what} is {len(value)} characters long", f"use at most {MAX_TEXT}")
    return value


def safe_name_from(text: str, prefix: str) -> str:
    """A safe name derived from free text (e.g. a file's stem): unsafe runs become ``-``."""
    cleaned = _UNSAFE_RUN.sub("-", text).strip("-.")
    return f"{prefix}-{cleaned}"[:MAX_NAME] if cleaned else prefix
