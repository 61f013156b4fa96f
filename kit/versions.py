"""Version strings as comparable tuples, with one error message for malformed ones."""

from __future__ import annotations

import re

from kit.errors import KitError

_VERSION = re.compile(r"^\d+(\.\d+){1,3}$")


def parse(value: object, field: str, example: str = "12.9.1") -> tuple[int, ...]:
    """``"12.9.1"`` -> ``(12, 9, 1)``; anything else is a KitError naming ``field``."""
    text = str(value).strip()
    if not _VERSION.match(text):
        raise KitError(field, f"{text!r} is not a version", f"write it like {example}")
    return tuple(int(p) for p in text.split("."))


def is_version(value: object) -> bool:
    return bool(_VERSION.match(str(value).strip()))


def major_minor(value: str) -> str:
    """``"12.9.1"`` -> ``"12.9"`` (the form NVIDIA's package suffixes use: ``+cuda12.9``)."""
    return ".".join(str(value).split(".")[:2])


def at_least(value: str, minimum: str) -> bool:
    return _pad(parse(value, "version")) >= _pad(parse(minimum, "version"))


def _pad(v: tuple[int, ...]) -> tuple[int, ...]:
    return v + (0,) * (4 - len(v))
