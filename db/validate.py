"""Input checks shared by the store: each raises StoreError naming the field and what is allowed."""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from db.errors import StoreError
from db.keys import canonical_json

MAX_NAME_CHARS = 200
MAX_NOTES_CHARS = 10_000
MAX_SEED = 2**63 - 1  # SQLite INTEGER is a signed 64-bit value


def text(value: Any, field: str, *, max_chars: int = MAX_NAME_CHARS, allow_empty: bool = False) -> str:
    """A string (stripped of surrounding whitespace unless empty is allowed) of bounded length."""
    if not isinstance(value, str):
        raise StoreError(field, "must be a string")
    cleaned = value if allow_empty else value.strip()
    if not allow_empty and not cleaned:
        raise StoreError(field, "must not be empty")
    if len(cleaned) > max_chars:
        raise StoreError(field, f"must be at most {max_chars} characters")
    try:  # SQLite stores UTF-8: a lone surrogate (JSON "\\ud800" without its pair) cannot be stored
        cleaned.encode("utf-8")
    except UnicodeEncodeError:
        raise StoreError(field, "must be valid Unicode text: it holds a lone surrogate") from None
    return cleaned


# Categories a name never needs and that let two names look alike or hide (issue 42): controls (NUL, the ESC of an
# ANSI escape), formatting (zero-width characters, right-to-left overrides), line/paragraph separators, surrogates,
# private use and unassigned code points.
_NAME_REFUSED = {"Cc": "a control character", "Cf": "an invisible formatting character",
                 "Zl": "a line separator", "Zp": "a paragraph separator", "Cs": "a surrogate",
                 "Co": "a private-use character", "Cn": "an unassigned code point"}
# Letters and symbols that render blank: the Hangul fillers, the halfwidth filler and the blank braille pattern.
_BLANK_GLYPHS = {"\u115f", "\u1160", "\u3164", "\uffa0", "\u2800"}


def name(value: Any, field: str) -> str:
    """A person's name (a reviewer's): text() plus no control, formatting or invisible characters, and at least one
    visible one; names of zero-width characters only, NUL, ANSI escapes or a right-to-left override were stored."""
    cleaned = text(value, field)
    for ch in cleaned:
        kind = _NAME_REFUSED.get(unicodedata.category(ch))
        if kind is not None:
            raise StoreError(field, f"must be a plain name: U+{ord(ch):04X} is {kind}")
    if not any(unicodedata.category(ch)[0] in "LNPS" and ch not in _BLANK_GLYPHS for ch in cleaned):
        raise StoreError(field, "must contain a visible character")
    return cleaned


def integer(value: Any, field: str, *, minimum: int = 0, maximum: int = MAX_SEED) -> int:
    """An int (bools rejected: True is an int in Python but never a valid seed or size)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise StoreError(field, "must be an integer")
    if not minimum <= value <= maximum:
        raise StoreError(field, f"must be between {minimum} and {maximum}")
    return value


def number(value: Any, field: str, *, minimum: float = 0.0, allow_none: bool = False) -> float | None:
    """A finite float ≥ minimum, or None when allowed."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise StoreError(field, "must be a finite number" + (" or null" if allow_none else ""))
    if value < minimum:
        raise StoreError(field, f"must be >= {minimum}")
    return float(value)


def one_of(value: Any, field: str, allowed: Iterable[str]) -> str:
    """A value from a fixed vocabulary; the message lists the allowed values."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise StoreError(field, f"must be one of: {', '.join(allowed)} (got {value!r})")
    return value


def json_dict(value: Any, field: str) -> dict[str, Any]:
    """A dict that survives a JSON round trip unchanged (so the stored snapshot is exact)."""
    if not isinstance(value, dict):
        raise StoreError(field, "must be a JSON object (dict)")
    canonical_json(value, field)
    return value


def reasons(value: Any, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """Reasons as a de-duplicated tuple in the given order, each from ``allowed``."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise StoreError("reasons", f"must be a list drawn from: {', '.join(allowed)}")
    unknown = [r for r in value if r not in allowed]
    if unknown:
        raise StoreError("reasons", f"unknown {unknown!r}; allowed: {', '.join(allowed)}")
    return tuple(dict.fromkeys(value))


def utc_naive(value: Any, field: str) -> datetime | None:
    """A datetime converted to naive UTC for storage (naive input is taken to be UTC already)."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise StoreError(field, "must be a datetime or null")
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value
