"""Where CUDA comes from, as data (``images/cuda.yaml``): Debian's toolkit per release, looked up by version, and
the PyPI wheels per stage."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import yaml

from kit import paths
from kit.versions import major_minor


@lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    return yaml.safe_load((paths.images_dir() / "cuda.yaml").read_text(encoding="utf-8"))


def debian_known() -> str:
    """The CUDA versions Debian packages, with their releases: ``11.8 (bookworm), 12.4 (trixie)``."""
    return ", ".join(f"{version} ({toolkit['suite']})" for version, toolkit in table()["debian"].items())


def unknown_debian_version(cuda_version: str) -> tuple[str, str]:
    """(problem, fix) for a CUDA version no Debian release packages: one text for the rules and the producers."""
    return (f"no Debian release packages CUDA {cuda_version}; Debian has {debian_known()}",
            "set cuda.version to one of those with cuda.source: debian")


def debian_toolkit(cuda_version: str) -> dict[str, Any] | None:
    """The Debian release and packages for ``cuda.source: debian`` at this CUDA version; None when none has it."""
    return table()["debian"].get(major_minor(cuda_version))


def cuda_wheels(stage: str, cuda_version: str) -> list[str]:
    """The CUDA wheels of a stage (builder | runtime) for ``cuda.source: wheels``, pinned to the CUDA version."""
    pin = f"=={major_minor(cuda_version)}.*"
    return [wheel + pin for wheel in table()["wheels"][stage]]
