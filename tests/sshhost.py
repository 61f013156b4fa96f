"""A private ``sshd`` on 127.0.0.1 that serves one Docker daemon, the way a second box serves its own: a client runs
``ssh HOST docker system dial-stdio`` (what ``docker -H ssh://``, compose and the SDK's ``use_ssh_client`` do), and
the server's ``SetEnv DOCKER_HOST=...`` (sshd_config, OpenSSH >= 8.7) points that ``docker`` at the test's daemon.

The client side is a wrapper ``ssh`` first on PATH that adds ``-F`` with the test's own key and no known-hosts
file, so nothing under ~/.ssh is touched (ssh reads ~ from the password database, not $HOME).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SSHD = Path("/usr/sbin/sshd")


@dataclass(frozen=True)
class SshHost:
    port: int
    bin_dir: Path  # put first on PATH: its `ssh` uses the test's key and config

    def url(self, user: str = "root") -> str:
        return f"ssh://{user}@127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {**os.environ, "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def ssh_host(docker_host: str) -> Iterator[SshHost]:
    """sshd for ``docker_host`` (unix:///... of the daemon a client should reach)."""
    folder = Path(tempfile.mkdtemp(prefix="kit-ssh-"))
    port = _free_port()
    for key in ("host_key", "user_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / key)], check=True)
    (folder / "authorized_keys").write_text((folder / "user_key.pub").read_text())
    (folder / "authorized_keys").chmod(0o600)
    (folder / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {folder}/host_key\n"
        f"AuthorizedKeysFile {folder}/authorized_keys\nPermitRootLogin prohibit-password\n"
        f"PasswordAuthentication no\nKbdInteractiveAuthentication no\nStrictModes no\nUsePAM no\n"
        f"PidFile {folder}/sshd.pid\nSetEnv DOCKER_HOST={docker_host}\nMaxStartups 50\nMaxSessions 50\n")
    (folder / "ssh_config").write_text(
        f"Host 127.0.0.1\n  IdentityFile {folder}/user_key\n  IdentitiesOnly yes\n  UserKnownHostsFile /dev/null\n"
        "  StrictHostKeyChecking no\n  LogLevel ERROR\n  BatchMode yes\n")
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "ssh"
    wrapper.write_text(f"#!/bin/sh\nexec /usr/bin/ssh -F {folder}/ssh_config \"$@\"\n")
    wrapper.chmod(0o755)
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation folder
    proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(folder / "sshd_config")],
                            stdout=subprocess.DEVNULL, stderr=open(folder / "sshd.log", "w"), start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(folder / 'sshd.log').read_text()[-1500:]}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("sshd did not listen in 20 s")
            time.sleep(0.2)
        yield SshHost(port, bin_dir)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        subprocess.run(["rm", "-rf", str(folder)])
