"""Change one field of a user's kit.yaml in place, keeping every other line and comment as the user left it.

``kit init`` writes block-style sections (``model:`` then indented ``file: ...  # comment``, and
``engines:`` / ``  llama.cpp:`` / ``    ubatch: 512``); this edits that shape line by line, at any depth. A key it
cannot find in a block is added as the block's first line; a flow mapping (``model: {dir: ./m}``) is rewritten on its
own line from its parsed value.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml


# a YAML scalar on one line: quoted (a '#' inside is not a comment) or plain (up to a comment: space, then '#')
VALUE = r"'(?:[^']|'')*'|\"(?:[^\"\\]|\\.)*\"|.*?"


def _scalar(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()


def _key(key: str) -> str:
    """A key as YAML writes it (``llama.cpp`` is plain; a key that needs quotes gets them)."""
    return _scalar(key)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _nested(keys: list[str], value: Any) -> Any:
    for key in reversed(keys):
        value = {key: value}
    return value


def _block_lines(keys: list[str], value: Any, indent: int, comment: str) -> list[str]:
    """Lines for ``keys`` (outermost first) set to ``value``, block style from ``indent``."""
    lines = []
    for depth, key in enumerate(keys[:-1]):
        lines.append(f"{' ' * (indent + 2 * depth)}{_key(key)}:\n")
    tail = f"  # {comment}" if comment else ""
    lines.append(f"{' ' * (indent + 2 * (len(keys) - 1))}{_key(keys[-1])}: {_scalar(value)}{tail}\n")
    return lines


def set_path(path: Path, keys: list[str], value: Any, comment: str = "") -> None:
    """Set ``keys`` (e.g. ``["engines", "llama.cpp", "ubatch"]``) to ``value``; ``comment`` replaces the changed
    line's trailing comment (the user's stays when none is given)."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    # the block being searched: from lines[start] to the first line indented less than ``indent``, its keys' indent
    start, indent = 0, 0
    for depth, key in enumerate(keys):
        last = depth == len(keys) - 1
        found = None
        for i in range(start, len(lines)):
            line = lines[i]
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if _indent(line) < indent:  # the block ends here, without the key
                break
            if _indent(line) == indent and re.match(rf"^\s*{re.escape(_key(key))}:(\s|$)", line):
                found = i
                break
        if found is None:  # missing from this block: add the rest of the path as the block's first lines
            at = start if depth > 0 else len(lines)
            lines[at:at] = _block_lines(keys[depth:], value, indent, comment)
            break
        line = lines[found]
        prefix = f"{' ' * indent}{_key(key)}:"
        rest = line[len(prefix):]
        if last:
            # VALUE ends in a lazy ``.*?``: every line matches, with the user's comment in group 3 when there is one
            user_comment = re.match(rf"^(\s*)({VALUE})(\s+#.*)?\n?$", rest).group(3)  # type: ignore[union-attr]
            kept = f"  # {comment}" if comment else (user_comment or "")
            lines[found] = f"{prefix} {_scalar(value)}{kept}\n"
            break
        if rest.strip().startswith("{"):  # a flow mapping: rewrite that line from its parsed value
            data = yaml.safe_load(line)[key] or {}
            node = data
            for inner in keys[depth + 1:-1]:
                node = node.setdefault(inner, {})
            node[keys[-1]] = value
            lines[found] = f"{prefix} {yaml.safe_dump(data, default_flow_style=True, width=10**6).strip()}\n"
            break
        # a block: its children are the indented lines that follow
        child_indent = None
        for j in range(found + 1, len(lines)):
            if lines[j].strip() and not lines[j].lstrip().startswith("#"):
                child_indent = _indent(lines[j]) if _indent(lines[j]) > indent else None
                break
        # the next depth's search starts under this key and stops at the first line indented less than the children,
        # which is where this block ends
        start = found + 1
        if child_indent is None:  # an empty block: the rest of the path goes right under it
            lines[start:start] = _block_lines(keys[depth + 1:], value, indent + 2, comment)
            break
        indent = child_indent
    path.write_text("".join(lines), encoding="utf-8")


def set_field(path: Path, section: str, key: str, value: str) -> None:
    """One field of a top-level section (``model.file``)."""
    set_path(path, [section, key], value)
