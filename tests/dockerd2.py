"""A second, throw-away Docker daemon on this machine: its own socket, data root, exec root, pid file and containerd
namespace, a default bridge of its own and no iptables rules (so it cannot clash with the daemon CI already runs), and
address pools of its own. Never ``--bridge none``: a daemon without a default bridge deletes the host's ``docker0``
at start (moby daemon_unix.go, ``removeDefaultBridgeInterface``), which takes the first daemon's network with it. Extra programs can be put on its PATH, which is how dockerd finds the NVIDIA hook
(tests/nvidiahook.py). Images come from the first daemon by ``docker save | docker load``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Daemon:
    host: str        # DOCKER_HOST for clients: unix:///.../docker.sock
    folder: Path
    log: Path

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.host, **extra}

    def docker(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["docker", "-H", self.host, *args], capture_output=True, text=True, check=check,
                              timeout=timeout)

    def load_from_first(self, *tags: str) -> None:
        """Copy images from the default daemon into this one (no registry needed)."""
        save = subprocess.Popen(["docker", "save", *tags], stdout=subprocess.PIPE)
        load = subprocess.run(["docker", "-H", self.host, "load", "-q"], stdin=save.stdout, capture_output=True,
                              text=True, timeout=900)
        assert save.stdout is not None
        save.stdout.close()
        if save.wait() != 0 or load.returncode != 0:
            raise RuntimeError(f"docker save | load failed: {load.stderr.strip()}")


@contextmanager
def second_daemon(path_dirs: list[Path] = (), pool: str = "10.213.0.0/16", bridge_cidr: str = "10.214.0.1/24",
                  extra_env: dict[str, str] | None = None, start_timeout_s: float = 60,
                  runtime: Path | None = None, extra_args: list[str] = ()) -> Iterator[Daemon]:
    """``runtime``: an OCI runtime binary to use as the default one (e.g. tests/runc_rlimits.py's wrapper);
    ``extra_args``: more dockerd flags (a TLS-verified tcp:// listener besides the socket)."""
    bridge = "kd2br0"
    subprocess.run(["ip", "link", "delete", bridge], capture_output=True)  # a leftover of a killed run
    for args in (["link", "add", bridge, "type", "bridge"], ["addr", "add", bridge_cidr, "dev", bridge],
                 ["link", "set", bridge, "up"]):
        subprocess.run(["ip", *args], check=True, capture_output=True)
    folder = Path(tempfile.mkdtemp(prefix="kd2-", dir="/tmp"))  # short: containerd's socket path must fit 108 bytes
    socket = folder / "docker.sock"
    log = folder / "dockerd.log"
    env = {**os.environ, **(extra_env or {})}
    env["PATH"] = os.pathsep.join([*(str(p) for p in path_dirs), env.get("PATH", "")])
    cmd = ["dockerd", "--host", f"unix://{socket}", "--data-root", str(folder / "root"), "--exec-root",
           str(folder / "x"), "--pidfile", str(folder / "docker.pid"), "--containerd-namespace", "kd2",
           "--containerd-plugins-namespace", "kd2-plugins", "--bridge", bridge, "--iptables=false",
           "--ip6tables=false", "--default-address-pool", f"base={pool},size=24", "--storage-driver", "overlay2"]
    if runtime is not None:
        cmd += ["--add-runtime", f"kd2={runtime}", "--default-runtime", "kd2"]
    cmd += list(extra_args)
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    daemon = Daemon(f"unix://{socket}", folder, log)
    # The first daemon sets FORWARD's policy to DROP and bridged traffic passes iptables (bridge-nf-call-iptables),
    # so containers of this daemon could not reach each other; this daemon writes no rules of its own (--iptables
    # false, so it cannot remove the first one's chains): let its address pool through, and only it.
    forward = ["FORWARD", "-s", pool, "-d", pool, "-j", "ACCEPT"]
    subprocess.run(["iptables", "-I", *forward], capture_output=True)
    try:
        deadline = time.monotonic() + start_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the second dockerd exited: {log.read_text()[-2000:]}")
            if socket.exists() and daemon.docker("info", check=False, timeout=10).returncode == 0:
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"the second dockerd did not answer in {start_timeout_s:.0f} s")
        yield daemon
    finally:
        if proc.poll() is None:
            running = daemon.docker("ps", "-aq", check=False, timeout=30).stdout.split()
            if running:
                daemon.docker("rm", "-f", *running, check=False, timeout=120)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        subprocess.run(["iptables", "-D", *forward], capture_output=True)
        # whatever the daemon left mounted under its folders (overlay, shm, netns) goes before the folder does
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                  if line.split()[1].startswith(str(folder))]
        for mount in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run(["ip", "link", "delete", bridge], capture_output=True)
