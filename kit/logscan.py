"""Scan engine logs for the failures that only show up as warnings (``images/log-signatures.yaml``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import yaml

from kit import paths


@dataclass(frozen=True)
class Finding:
    name: str
    line: str
    advice: str


@lru_cache(maxsize=1)
def signatures() -> list[tuple[str, re.Pattern[str], str]]:
    data = yaml.safe_load((paths.images_dir() / "log-signatures.yaml").read_text(encoding="utf-8"))
    return [(s["name"], re.compile(s["pattern"]), s["advice"]) for s in data["signatures"]]


def scan(text: str) -> list[Finding]:
    """One finding per signature (its first line); a line belongs to the first signature that matches it."""
    found: dict[str, Finding] = {}
    for line in text.splitlines():
        for name, pattern, advice in signatures():
            if pattern.search(line):
                if name not in found:
                    found[name] = Finding(name, line.strip()[:300], advice)
                break
    return list(found.values())
