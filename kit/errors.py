"""One error type for everything a user can get wrong.

Each error names the config field (a dotted path such as ``cuda.version``) and the fix, so the CLI can print it as
one line and exit with code 2. Nothing else in kit prints errors for bad input.
"""

from __future__ import annotations


class KitError(Exception):
    """A user-facing error: ``<field>: <problem>; <fix>``."""

    exit_code = 2

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(self.line())

    def line(self) -> str:
        text = f"{self.field}: {self.problem}" if self.field else self.problem
        return f"{text}; {self.fix}" if self.fix else text


class CheckFailed(Exception):
    """A verification or health check failed (exit code 1, not a config error)."""

    exit_code = 1
