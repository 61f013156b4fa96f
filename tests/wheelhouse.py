"""Writes a wheelhouse holding one pure-Python wheel, ``ninfer``, made from tests/standin_ninfer.py: the wheel format
by hand (PEP 427: ``{name}-{version}.dist-info/`` with METADATA, WHEEL, entry_points.txt and a RECORD of sha256
digests), so no build backend or index is needed to make it. pip checks the RECORD when it installs the wheel.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_ninfer_wheel(folder: Path, version: str = "0.0.1") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    info = f"ninfer-{version}.dist-info"
    files = {
        "ninfer/__init__.py": (HERE / "standin_ninfer.py").read_text(),
        "ninfer/__main__.py": "import sys\nfrom ninfer import main\nsys.exit(main())\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: ninfer\nVersion: {version}\n"
                            "Summary: kit's stand-in NInfer (tests)\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: kit-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": "[console_scripts]\nninfer = ninfer:main\n",
    }
    record = [f"{name},{_digest(text.encode())},{len(text.encode())}" for name, text in files.items()]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    wheel = folder / f"ninfer-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in files.items():
            z.writestr(name, text)
    return wheel
