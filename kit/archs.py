"""SM architecture lists in the spellings each build system wants.

CMake wants ``70-real`` (SASS only: a V100 must not fall back to JIT-compiled PTX from another arch); torch wants
``7.0``. One list in the config, two spellings here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kit.config import StackConfig


def configured(config: StackConfig) -> list[int]:
    """The stack's ``hardware.archs`` as numbers (``native`` is refused by the rules before any build)."""
    return [int(a) for a in config.hardware.archs]


def cmake(archs: list[int]) -> str:
    return ";".join(f"{a}-real" for a in archs)


def torch(archs: list[int]) -> str:
    return " ".join(f"{a // 10}.{a % 10}" for a in archs)


def label(archs: list[int]) -> str:
    """Tag form: ``sm70`` or ``sm70-80``; ``cpu`` when there is none."""
    return "sm" + "-".join(str(a) for a in archs) if archs else "cpu"
