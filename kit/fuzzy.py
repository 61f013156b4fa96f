"""Closest-name suggestions for unknown keys and names (difflib, no extra dependency)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: str, choices: Iterable[str]) -> str | None:
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return found[0] if found else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    choices = sorted(choices)
    match = closest(word, choices)
    if match:
        return f"did you mean '{match}'?"
    return "valid: " + ", ".join(choices)
