"""Render a stack into an output folder, all or nothing.

Everything is rendered in memory first, written into a temporary folder next to the target and then swapped in,
so a bad config or a failing template leaves the previous output (or no output) untouched.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from kit import dockerfile, resolve
from kit.config import StackConfig
from kit.errors import KitError

Files = dict[str, "str | bytes | Path"]
# Files whose mode must be private (API keys in .env and in the k8s secret's env file).
PRIVATE = {".env", "api-key.env"}
# what `kit render --target` writes besides the images: a compose stack with its 1Panel apps, or Kubernetes manifests
TARGETS = ("compose", "k8s")


def image_files(config: StackConfig) -> Files:
    """``images/``: every image the stack builds, the engines' and the front door's, whichever target runs them."""
    from kit import compose
    from kit.services import FRONT_DOOR, services

    files: Files = {}
    for name in config.engine_names():
        for rel, content in dockerfile.render_files(config, name).items():
            files[f"images/{name}/{rel}"] = content
    if any(s.role == FRONT_DOOR for s in services(config)):
        for rel, content in compose.front_door_image_files(config).items():
            files[f"images/front-door/{rel}"] = content
    return files


def collect(config: StackConfig, out_dir: Path | None = None, target: str = "compose") -> Files:
    """Everything ``kit render`` writes; ``out_dir`` (the previous output) lets the API key stay what it was."""
    from kit import compose

    if target not in TARGETS:
        raise KitError("--target", f"unknown target {target!r}", f"use one of {', '.join(TARGETS)}")
    ca = config.mirrors.ca_bundle
    if ca and not Path(ca).is_file():
        raise KitError("mirrors.ca_bundle", f"{ca} is not a file", "point it at a PEM bundle on this host")
    files = image_files(config)
    stack = resolve.stack(config)
    if target == "k8s":
        from kit import k8s

        if config.hosts:
            raise KitError("hosts", "hosts: is for compose stacks; a cluster places pods on its own nodes",
                           "drop hosts: for --target k8s (more replicas: scale the Deployment)")
        existing = {**compose.read_env(out_dir / "k8s" / k8s.API_KEY_FILE), **compose.read_env(out_dir / ".env")} \
            if out_dir else {}
        files.update(k8s.files(stack, compose.api_key(existing)))
        return files
    files.update(compose.files(stack, out_dir))
    from kit.panel import export

    for rel, content in export.export_files(stack, config.engine_names()).items():
        files[f"appstore/{rel}"] = content
    return files


def write_tree(target: Path, files: Files) -> None:
    """Write ``files`` into a fresh temp dir beside ``target`` and swap it in; on any error nothing changes."""
    target = target.resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for rel, content in sorted(files.items()):
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, Path):
                shutil.copyfile(content, path)
            elif isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content, encoding="utf-8")
            if rel.endswith(".sh"):
                path.chmod(0o755)
            if Path(rel).name in PRIVATE:
                path.chmod(0o600)
        old = None
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            target.rename(old)
        tmp.rename(target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def render_stack(config: StackConfig, out: Path, target: str = "compose") -> list[str]:
    files = collect(config, out, target)
    write_tree(out, files)
    return sorted(files)
