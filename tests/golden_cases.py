"""The golden matrix: every engine x flavor x preset that kit renders, and the command that regenerates it.

    python tests/golden_cases.py --update     # after an intended template change; review the diff
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conftest import GOLDEN, make_config  # noqa: E402
from kit import render  # noqa: E402

CASES: dict[str, dict[str, Any]] = {
    "dual-v100-nvlink": {"preset": "dual-v100-nvlink"},
    "dual-v100-pcie": {"preset": "dual-v100-pcie"},
    "single-v100-32g": {"preset": "single-v100-32g"},
    "cpu": {"preset": "cpu"},
    "ninfer-primary": {"preset": "ninfer-primary"},
    "vllm-dual-v100": {"preset": "dual-v100-nvlink", "stack": {"primary": "vllm"}},
    "debian-cuda-11-8": {"preset": "dual-v100-nvlink", "cuda": {"source": "debian", "version": "11.8.0"},
                         "nccl": {"source": "pip"}},
    "debian-cuda-12-4": {"preset": "dual-v100-nvlink", "cuda": {"source": "debian", "version": "12.4.1"},
                         "nccl": {"source": "pip"}},
    "wheels-pip-nccl": {"preset": "dual-v100-nvlink", "cuda": {"source": "wheels"}, "nccl": {"source": "pip"},
                        "mirrors": {"apt": "http://mirrors.example.cn", "pip_index": "https://pypi.example.cn/simple"}},
}


def render_case(name: str) -> dict[str, str]:
    files = render.collect(make_config(CASES[name]))
    # .env holds a random API key and an absolute path: checked by its own tests, not golden
    return {rel: content for rel, content in files.items() if isinstance(content, str) and rel != ".env"}


def update() -> None:
    import shutil

    shutil.rmtree(GOLDEN, ignore_errors=True)
    for name in CASES:
        for rel, text in render_case(name).items():
            path = GOLDEN / name / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    print(f"wrote {GOLDEN}")


if __name__ == "__main__" and "--update" in sys.argv:
    update()
