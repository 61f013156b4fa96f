"""A wrapper around ``runc`` for the second dockerd (tests/dockerd2.py) on a CI machine without CAP_SYS_RESOURCE.

kit's GPU services ask for ``ulimits: {memlock: -1}`` (pinned host memory for CUDA and NCCL). On a real host dockerd
runs with every capability and runc raises the limit; in this CI sandbox the hard limit is 8 MiB and cannot be raised
("error setting rlimit type 8: operation not permitted"). This wrapper lowers each requested rlimit to what the machine
allows, in the OCI bundle's ``config.json`` (runtime-spec ``config.md``, ``process.rlimits``), records what was asked
in ``$KIT_RLIMIT_LOG`` so the test can check the request itself, and then runs the real runc with the same argv.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
from pathlib import Path

LIMITS = {"RLIMIT_MEMLOCK": resource.RLIMIT_MEMLOCK, "RLIMIT_STACK": resource.RLIMIT_STACK,
          "RLIMIT_NOFILE": resource.RLIMIT_NOFILE}


def clamp(spec_file: Path, process_only: bool = False) -> None:
    """Lower the rlimits of a bundle's config.json, or of an ``exec --process`` file (a bare process object, which
    Docker's health checks and ``docker exec`` send with the container's rlimits)."""
    spec = json.loads(spec_file.read_text())
    process = spec if process_only else (spec.get("process") or {})
    asked = []
    for limit in process.get("rlimits") or []:
        kind = LIMITS.get(limit["type"])
        if kind is None:
            continue
        asked.append(dict(limit))
        hard = resource.getrlimit(kind)[1]
        if hard != resource.RLIM_INFINITY:
            limit["hard"] = min(limit["hard"], hard)
            limit["soft"] = min(limit["soft"], limit["hard"])
    spec_file.write_text(json.dumps(spec))
    log = os.environ.get("KIT_RLIMIT_LOG")
    if log and asked:
        with open(log, "a") as f:
            f.write(json.dumps({"file": str(spec_file), "rlimits": asked}) + "\n")


def main(argv: list[str]) -> None:
    if "create" in argv and "--bundle" in argv:
        clamp(Path(argv[argv.index("--bundle") + 1]) / "config.json")
    if "exec" in argv and "--process" in argv:
        clamp(Path(argv[argv.index("--process") + 1]), process_only=True)
    runc = shutil.which("runc")
    os.execv(runc, ["runc", *argv[1:]])


if __name__ == "__main__":
    main(sys.argv)
