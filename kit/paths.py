"""Where the shipped data lives.

In a wheel, ``templates/`` and ``images/`` are copied into ``kit/_data``; in a source checkout (``pip install -e``)
they are the top-level folders next to ``kit/``. Everything else asks this module instead of guessing.
"""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def _data_root() -> Path:
    packaged = _PKG / "_data"
    return packaged if (packaged / "images").is_dir() else _PKG.parent


def templates_dir() -> Path:
    return _data_root() / "templates"


def images_dir() -> Path:
    return _data_root() / "images"
