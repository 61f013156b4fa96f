"""Where CUDA comes from, as data (``images/cuda.yaml``): Debian's toolkit per release, looked up by version."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import yaml

from kit import paths
from kit.versions import major_minor


@lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    return yaml.safe_load((paths.images_dir() / "cuda.yaml").read_text(encoding="utf-8"))


def debian_versions() -> list[str]:
    """The CUDA versions (major.minor) a Debian release packages, oldest first."""
    return list(table()["debian"])


def debian_toolkit(cuda_version: str) -> dict[str, Any] | None:
    """The Debian release and packages for ``cuda.source: debian`` at this CUDA version; None when none has it."""
    return table()["debian"].get(major_minor(cuda_version))
