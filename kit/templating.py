"""The one jinja2 environment: sandboxed (templates cannot reach Python) and strict (a typo is an error)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from jinja2 import FileSystemLoader, StrictUndefined
from jinja2.sandbox import SandboxedEnvironment

from kit import paths


@lru_cache(maxsize=1)
def environment() -> SandboxedEnvironment:
    env = SandboxedEnvironment(
        loader=FileSystemLoader(str(paths.templates_dir())),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
        autoescape=False,
    )
    env.policies["json.dumps_kwargs"] = {"sort_keys": False}
    return env


def render(template: str, context: dict[str, Any]) -> str:
    text = environment().get_template(template).render(**context)
    # collapse the blank lines that empty optional blocks leave behind
    lines, out, blank = text.splitlines(), [], 0
    for line in lines:
        blank = blank + 1 if not line.strip() else 0
        if blank <= 1:
            out.append(line.rstrip())
    return "\n".join(out).strip() + "\n"
