"""`kit verify`'s checks over an exported image root instead of a container: the mutation benchmark's backend.

Every check of ``kit/verify.py`` reaches the image through ``Inspection``: ``host.run`` (a command in the image),
``host.file``, ``config``, ``manifest``, ``history()``, ``root_output()``, ``copy_in`` and ``copy_out``. The real one
starts a container per image and runs each command with ``docker exec``; a mutation run repeats every adversarial
image's checks for each of hundreds of mutants, which at a container per image takes hours. ``RootInspection`` gives
the same surface over the image's filesystem exported once (``docker export``) into a folder, and runs each command
the way ``docker exec`` does, modelled on the code that does it:

- the process runs as the image's ``USER``: a name or number looked up in the image's own ``/etc/passwd`` and
  ``/etc/group`` (runc ``libcontainer/init_linux.go`` ``setupUser``: ``user.GetExecUserPath`` with the defaults uid 0,
  gid 0, home ``/``, so a numeric uid with no passwd entry gets gid 0), then ``Setgroups``, ``Setgid``, ``Setuid``;
- its environment is moby's ``container/container.go`` ``CreateDaemonEnvironment``: ``PATH`` (``DefaultPathEnv``) and
  ``HOSTNAME`` first, the image's ``Env`` replacing them; then ``HOME`` from the user's passwd entry when the
  environment has none (runc ``setupUser``: "if we didn't get HOME already, set it based on the user's HOME");
- in the image's ``WorkingDir`` (``/`` when unset), through ``/bin/sh -c`` as testinfra's docker backend does;
- ``copy_out`` of a path whose last part is a symlink gives the link, not its target, as ``docker cp`` does (the
  checks resolve links themselves with ``readlink -f`` first).

The Docker-tier tests in ``test_verify_adversarial.py`` run every image through both backends and require the same
verdict and the same detail, so this stand-in cannot drift from the container unnoticed.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import testinfra.host
from testinfra.backend import base

from kit import verify

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # moby oci.DefaultPathEnv (linux)


def export(client: Any, tag: str, folder: Path) -> Path:
    """``folder/root`` (the image's filesystem, owners and modes kept) and ``folder/image.json``; reused when the
    folder already holds this image id."""
    image = client.images.get(tag)
    meta = folder / "image.json"
    if meta.is_file() and json.loads(meta.read_text())["id"] == image.id:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "root").mkdir(parents=True)
    container = client.containers.create(image.id, entrypoint=["true"], command=[])
    try:
        tar = subprocess.Popen(["tar", "-x", "-p", "--numeric-owner", "-f", "-", "-C", str(folder / "root")],
                               stdin=subprocess.PIPE)
        assert tar.stdin is not None
        for chunk in container.export():
            tar.stdin.write(chunk)
        tar.stdin.close()
        if tar.wait() != 0:
            raise RuntimeError(f"tar could not unpack the export of {tag}")
    finally:
        container.remove(force=True)
    dev = folder / "root" / "dev"
    dev.mkdir(exist_ok=True)
    if not (dev / "null").exists():  # a container's /dev has it: `2>/dev/null` must not create a file
        os.mknod(dev / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        os.chmod(dev / "null", 0o666)
    meta.write_text(json.dumps({"id": image.id, "tag": tag, "config": image.attrs.get("Config") or {},
                                "history": image.history()}))
    return folder


def _table(root: Path, name: str) -> list[list[str]]:
    path = root / "etc" / name
    if not path.is_file():
        return []
    return [line.split(":") for line in path.read_text(errors="replace").splitlines() if line and line[0] != "#"]


def exec_user(root: Path, spec: str) -> tuple[int, int, list[int], str]:
    """(uid, gid, supplementary gids, home) for a ``USER`` value, as moby resolves it in the image's own files."""
    name, _, group = (spec or "0").partition(":")
    passwd = _table(root, "passwd")
    entry = next((e for e in passwd if len(e) >= 6 and (e[0] == name or e[2] == name)), None)
    if entry is None:
        if not name.isdigit():
            raise RuntimeError(f"unable to find user {name}: no matching entries in passwd file")
        uid, gid, home, login = int(name), 0, "/", ""
    else:
        uid, gid, home, login = int(entry[2]), int(entry[3]), entry[5] or "/", entry[0]
    groups = _table(root, "group")
    if group:
        found = next((g for g in groups if len(g) >= 3 and (g[0] == group or g[2] == group)), None)
        gid = int(found[2]) if found else int(group)
    extra = sorted({int(g[2]) for g in groups if len(g) >= 4 and login and login in g[3].split(",")} | {gid})
    return uid, gid, extra, home


class RootBackend(base.BaseBackend):
    """testinfra backend: ``/bin/sh -c`` in a chroot, as one user, in one environment and folder."""

    NAME = "kit-root"

    def __init__(self, root: Path, uid: int, gid: int, groups: list[int], env: dict[str, str], cwd: str) -> None:
        self.root, self.uid, self.gid, self.groups, self.env, self.cwd = root, uid, gid, groups, env, cwd
        super().__init__(str(root))

    def run(self, command: str, *args: str, **kwargs: Any) -> base.CommandResult:
        cmd = self.get_command(command, *args)
        proc = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, env=self.env, preexec_fn=self._enter)
        return self.result(proc.returncode, self.encode(cmd), proc.stdout, proc.stderr)

    def _enter(self) -> None:
        os.chroot(self.root)
        os.chdir(self.cwd)
        os.setgroups(self.groups)
        os.setgid(self.gid)
        os.setuid(self.uid)


class RootInspection(verify.Inspection):
    """``verify.Inspection`` over ``export()``'s folder; ``name`` is that folder."""

    def __init__(self, name: str) -> None:
        folder = Path(name)
        meta = json.loads((folder / "image.json").read_text())
        self.root = folder / "root"
        self.name = meta["tag"]
        self.config: dict[str, Any] = meta["config"]
        self._history = meta["history"]
        self.image = SimpleNamespace(id=meta["id"])
        self.host = testinfra.host.Host(self._backend(self.config.get("User") or ""))
        self._root_host = testinfra.host.Host(self._backend("0"))
        self.manifest = None
        self.copied: set[str] = set()
        self.stack = None
        if self.host.file(verify.MANIFEST).exists:
            self.manifest = json.loads(self.host.file(verify.MANIFEST).content_string)

    def _backend(self, user: str) -> RootBackend:
        uid, gid, groups, home = exec_user(self.root, user)
        env = dict(item.partition("=")[::2] for item in self.config.get("Env") or [])
        env.setdefault("PATH", DEFAULT_PATH)
        env.setdefault("HOME", home)
        env.setdefault("HOSTNAME", "kit-verify")
        return RootBackend(self.root, uid, gid, groups, env, self.config.get("WorkingDir") or "/")

    def close(self) -> None:
        for path in self.copied:
            (self.root / path.lstrip("/")).unlink(missing_ok=True)

    def history(self) -> list[dict[str, Any]]:
        return self._history

    def root_output(self, script: str) -> str:
        return self._root_host.run(script).stdout

    def _inside(self, path: str) -> Path:
        """``path`` in the root, every part but the last resolved within it (a link's target is read from the
        image, never the host)."""
        here = self.root
        parts = [p for p in path.split("/") if p]
        for i, part in enumerate(parts):
            here = here / part
            hops = 0
            while i < len(parts) - 1 and here.is_symlink() and hops < 40:
                target = os.readlink(here)
                here = (self.root / target.lstrip("/")) if target.startswith("/") else here.parent / target
                hops += 1
        return here

    def copy_out(self, path: str, dest: Path) -> Path:
        source = self._inside(path)
        target = dest / Path(path).name
        target.write_bytes(b"" if source.is_symlink() else source.read_bytes())
        return target

    def copy_in(self, source: Path, folder: str = "/tmp") -> str:
        path = f"{folder}/{source.name}"
        if path not in self.copied:
            target = self._inside(path)
            target.write_bytes(source.read_bytes())
            target.chmod(0o755)
            self.copied.add(path)
        return path
