"""Change one field of a user's kit.yaml in place, keeping every other line and comment as the user left it.

``kit init`` writes block-style sections (``model:`` then indented ``file: ...  # comment``); this edits that
shape line by line. A field it cannot find in a block section is added as the section's first line.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml


# a YAML scalar on one line: quoted (a '#' inside is not a comment) or plain (up to a comment: space, then '#')
VALUE = r"'(?:[^']|'')*'|\"(?:[^\"\\]|\\.)*\"|.*?"


def _scalar(value: str) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def set_field(path: Path, section: str, key: str, value: str) -> None:
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    text = _scalar(value)
    start = next((i for i, line in enumerate(lines) if re.match(rf"^{re.escape(section)}:\s*(#.*)?$", line)), None)
    if start is None:
        flow = next((i for i, line in enumerate(lines) if re.match(rf"^{re.escape(section)}:\s*\{{", line)), None)
        if flow is not None:  # a flow mapping: rewrite that one line from its parsed value
            data = yaml.safe_load(lines[flow]) or {}
            data[section][key] = value
            lines[flow] = f"{section}: {yaml.safe_dump(data[section], default_flow_style=True).strip()}\n"
        else:
            lines.append(("" if not lines or lines[-1].endswith("\n") else "\n") + f"{section}:\n  {key}: {text}\n")
        path.write_text("".join(lines), encoding="utf-8")
        return
    match = None
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if line.strip() and not line.startswith((" ", "\t", "#")):
            break  # the next top-level key: the field is not in this section
        match = re.match(rf"^(\s+){re.escape(key)}:(\s*)({VALUE})(\s+#.*)?\n?$", line)
        if match:
            lines[i] = f"{match.group(1)}{key}: {text}{match.group(4) or ''}\n"
            break
    if not match:
        lines.insert(start + 1, f"  {key}: {text}\n")
    path.write_text("".join(lines), encoding="utf-8")
