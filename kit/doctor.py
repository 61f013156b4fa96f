"""``kit doctor``: is this host right for the stack? Each check is ok / warn / fail with the fix in one line.

Reads nvidia-smi (through kit/nvsmi.py), docker info and the NVIDIA container runtime / CDI setup, the facts in
``images/drivers.yaml``, and, for a running stack, the NCCL each engine loaded and its NCCL environment.
"""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from kit import catalog, nvsmi, paths
from kit.config import StackConfig
from kit.errors import KitError
from kit.versions import at_least

NO_DRIVER_EXIT = 3
CDI_DIRS = [Path("/etc/cdi"), Path("/var/run/cdi")]


@dataclass
class Finding:
    check: str
    status: str  # ok | warn | fail
    detail: str


@lru_cache(maxsize=1)
def drivers_table() -> dict[str, Any]:
    return yaml.safe_load((paths.images_dir() / "drivers.yaml").read_text(encoding="utf-8"))


class Report:
    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self.no_driver = False

    def add(self, check: str, status: str, detail: str) -> None:
        self.findings.append(Finding(check, status, detail))

    @property
    def exit_code(self) -> int:
        if self.no_driver:
            return NO_DRIVER_EXIT
        return 1 if any(f.status == "fail" for f in self.findings) else 0

    def as_dicts(self) -> list[dict[str, str]]:
        return [asdict(f) for f in self.findings]


def check_config(config: StackConfig, report: Report) -> None:
    from kit import rules

    try:
        rules.validate(config)
        report.add("config", "ok", "the stack config passes every V100 rule")
    except KitError as exc:
        report.add("config", "fail", exc.line())
        return
    check_model(config, report)


def check_model(config: StackConfig, report: Report) -> None:
    """Where the model is on this machine: a context past what it was trained for is said here too (render and
    plan say it), since llama-server then caps every request without a word to the client."""
    from kit import resolve

    for name in config.engine_names():
        try:
            resolved = resolve.engine(config, name)
            info = resolve.model_info(config, name)
        except KitError as exc:
            report.add(f"{name}-model", "fail", exc.line())
            continue
        if info is None:
            report.add(f"{name}-model", "warn", f"{resolved.host_model_path} is not on this machine")
        elif info.context_length and resolved.ctx > info.context_length:
            report.add(f"{name}-context", "warn", resolve.trained_length_note(resolved.ctx, info))
        else:
            trained = f" (trained for {info.context_length})" if info.context_length else ""
            report.add(f"{name}-context", "ok", f"{resolved.slots} requests x {resolved.ctx} tokens{trained}")


def check_driver(config: StackConfig, gpus: list[nvsmi.Gpu], driver_cuda: str | None, report: Report,
                 today: dt.date) -> None:
    driver = gpus[0].driver
    branch = driver.split(".")[0]
    info = drivers_table()["branches"].get(branch)
    volta = any(g.arch < 75 for g in gpus)
    if volta and int(branch) > drivers_table()["volta_last_branch"]:
        report.add("driver", "fail", f"driver {driver} (R{branch}) has no Volta support; install R580 (LTSB) or R535")
        return
    cuda_major = config.cuda.version.split(".")[0]
    needed = drivers_table()["cuda_min_driver"].get(cuda_major)
    if needed and not at_least(driver, needed):
        report.add("driver", "fail", f"driver {driver} cannot run CUDA {config.cuda.version} images (needs >= {needed}); "
                                     f"use cuda.version 12.9.1 or install R580")
        return
    note = ""
    if driver_cuda and not at_least(driver_cuda, ".".join(config.cuda.version.split(".")[:2])):
        note = f"; CUDA {config.cuda.version} runs on it through minor-version compatibility (driver reports {driver_cuda})"
    if info and info["eol"] < today.strftime("%Y-%m"):
        report.add("driver", "warn", f"driver {driver}: R{branch} {info['kind']} reached end of life {info['eol']}; "
                                     f"plan a move to R580 (LTSB, supported to 2028-08){note}")
    else:
        report.add("driver", "ok", f"driver {driver} (R{branch}) supports Volta and CUDA {config.cuda.version}{note}")


def check_gpus(config: StackConfig, gpus: list[nvsmi.Gpu], report: Report) -> None:
    want = config.hardware.gpus
    used = [g for g in gpus if str(g.index) in config.hardware.device_ids] or gpus[:want]
    if len(gpus) < want or len(used) < want:
        report.add("gpu-count", "fail", f"{len(gpus)} GPU(s) visible, the stack uses {want} (ids "
                                        f"{config.hardware.device_ids}); check seating, power and Above-4G decoding")
    else:
        report.add("gpu-count", "ok", f"{len(gpus)} GPU(s): " + ", ".join(f"{g.index}: {g.name}" for g in gpus))
    for g in used:
        expected = config.hardware.memory_gib * 1024
        if g.memory_mib < expected * 0.9:
            report.add(f"gpu{g.index}-memory", "warn",
                       f"{g.name} shows {g.memory_mib} MiB, config expects {config.hardware.memory_gib:g} GiB: "
                       "enable Above 4G Decoding / Large BAR in the BIOS (or fix hardware.memory_gib)")
        if config.hardware.gpu_model not in ("", "none") and g.name != config.hardware.gpu_model:
            report.add(f"gpu{g.index}-model", "warn", f"{g.name} is not hardware.gpu_model ({config.hardware.gpu_model})")
        archs = [int(a) for a in config.hardware.archs]
        if archs and g.arch not in archs:
            report.add(f"gpu{g.index}-arch", "fail", f"{g.name} is sm_{g.arch} but images are built for "
                                                     f"{archs}: add {g.arch} to hardware.archs")
        if not g.persistence:
            report.add(f"gpu{g.index}-persistence", "warn", "persistence mode off: first requests stall while the "
                                                            "driver wakes; run `nvidia-smi -pm 1`")
        splits = want > 1
        slow = (g.pcie_width is not None and g.pcie_width <= 4) or (g.pcie_gen_max is not None and g.pcie_gen_max <= 2)
        if slow and splits:
            report.add(f"gpu{g.index}-pcie", "warn",
                       f"GPU{g.index} link is PCIe gen{g.pcie_gen_max} x{g.pcie_width} (card max x{g.pcie_width_max}) "
                       "under a split model: move it to a CPU-attached x16/x8 slot")
        hot = drivers_table()["hot_celsius"]
        if g.temperature is not None and g.temperature >= hot:
            report.add(f"gpu{g.index}-temperature", "warn",
                       f"GPU{g.index} at {g.temperature} C (>= {hot}): passive V100s need forced airflow or a blower")
        reasons = _throttle(g.throttle)
        if reasons:
            report.add(f"gpu{g.index}-throttle", "warn", f"GPU{g.index} clocks held back: {', '.join(reasons)}")
        if g.ecc_uncorrected:
            report.add(f"gpu{g.index}-ecc", "warn", f"GPU{g.index} has {g.ecc_uncorrected} uncorrected ECC errors "
                                                    "since boot: reseat or replace the card")
    if not any(f.check.startswith("gpu") and f.status != "ok" for f in report.findings if f.check != "gpu-count"):
        report.add("gpus", "ok", "memory, arch, persistence, PCIe, temperature, clocks and ECC look right")


def _throttle(mask: str) -> list[str]:
    try:
        value = int(mask, 16)
    except ValueError:
        return []
    return [name for bit, name in drivers_table()["throttle_bits"].items() if value & int(bit, 16)]


def peer_traffic(config: StackConfig) -> bool:
    """Split modes that move activations between GPUs on every token."""
    if config.hardware.gpus < 2:
        return False
    primary = config.stack.primary
    return catalog.get(primary).plan.peer_traffic(config.engine_settings(primary).get("split_mode"))


def check_topology(config: StackConfig, links: dict[tuple[int, int], str], report: Report) -> None:
    ids = [int(i) for i in config.hardware.device_ids]
    if len(ids) < 2:
        return
    a, b = ids[0], ids[1]
    link = links.get((a, b), "?")
    if link.startswith("NV"):
        report.add("gpu-link", "ok", f"GPU{a} <-> GPU{b}: {link} (NVLink)")
    elif config.hardware.interconnect == "nvlink":
        report.add("gpu-link", "fail", f"hardware.interconnect is nvlink but GPU{a} <-> GPU{b} is {link}: check the "
                                       "NVLink bridge / SXM2 board, or set interconnect: pcie")
    elif link in ("PIX", "PXB"):
        report.add("gpu-link", "ok", f"GPU{a} <-> GPU{b}: {link} (through a PCIe switch)")
    else:
        status = "warn" if peer_traffic(config) else "ok"
        report.add("gpu-link", status, f"GPU{a} <-> GPU{b}: {link} (through the CPU)"
                   + ("; tensor/row split will be slow: prefer split_mode layer" if status == "warn" else ""))


def has_cdi_spec() -> bool:
    return any(d.is_dir() and any(d.glob("nvidia*.y*ml")) for d in CDI_DIRS)


NVIDIA_HOOK = "nvidia-container-runtime-hook"


def gpu_runtime(info: dict[str, Any]) -> bool:
    """Docker can hand NVIDIA GPUs to a container: the nvidia runtime is registered, a CDI spec exists, or the NVIDIA
    hook is installed (dockerd registers its "nvidia" device driver when it finds the hook on its PATH: moby
    daemon/nvidia_linux.go, init; compose's device reservations need nothing more)."""
    return "nvidia" in (info.get("Runtimes") or {}) or has_cdi_spec() or shutil.which(NVIDIA_HOOK) is not None


def check_docker(report: Report, info: dict[str, Any] | None, compose_ok: bool, gpu: bool = True) -> None:
    if info is None:
        report.add("docker", "fail", "Docker daemon unreachable: install docker.io and start dockerd")
        return
    report.add("docker", "ok", f"Docker {info.get('ServerVersion', '?')}, storage {info.get('Driver', '?')}")
    cdi = has_cdi_spec()
    if gpu_runtime(info):
        report.add("gpu-runtime", "ok", "NVIDIA runtime registered" + (" (CDI spec found)" if cdi else ""))
    elif not gpu:
        report.add("gpu-runtime", "ok", "no NVIDIA runtime; not needed by this CPU-only stack")
    else:
        report.add("gpu-runtime", "fail", f"no NVIDIA runtime in docker info, no {NVIDIA_HOOK} and no CDI spec: install "
                                          "nvidia-container-toolkit, run `nvidia-ctk runtime configure`, restart dockerd")
    report.add("compose", "ok" if compose_ok else "fail",
               "docker compose v2 available" if compose_ok else "no compose v2: install the docker compose plugin")
    root = info.get("DockerRootDir") or "/var/lib/docker"
    try:
        free = shutil.disk_usage(root).free / 2**30
    except OSError:
        return
    need = drivers_table()["min_docker_free_gib"]
    report.add("disk", "ok" if free >= need else "warn",
               f"{free:.0f} GiB free in {root}" + ("" if free >= need else f"; CUDA builds need ~{need} GiB"))


def _nccl_vars(env: list[str] | None) -> dict[str, str]:
    return {k: v for k, _, v in (e.partition("=") for e in env or []) if k.startswith("NCCL")}


def check_stack(config: StackConfig, report: Report) -> None:
    """For a running stack: the NCCL each engine loaded vs its manifest; NCCL env of image vs container; logs."""
    from kit import containerspec, deploy, dockerhost, logscan

    if not dockerhost.available():
        return
    containers = [c for c in deploy.containers(config) if c.labels.get("io.kit.engine")]
    if not containers:
        return
    expected_env = containerspec.nccl_env(config)
    for c in containers:
        if c.status != "running":
            report.add(f"{c.name}", "warn", f"{c.name} is {c.status}")
            continue
        probe = c.exec_run(["sh", "-c", "kit-nccl-version; cat /opt/kit/manifest.json"], demux=False)
        text = probe.output.decode(errors="replace") if probe.output else ""
        first = text.splitlines()[0] if text else ""
        pin = None
        if '"nccl_pin"' in text:
            import json as jsonlib

            manifest = jsonlib.loads(text[text.index("{"):])
            pin = manifest.get("nccl_pin")
        if pin:
            status = "ok" if first == pin else "fail"
            report.add(f"{c.name}-nccl", status, f"loads NCCL {first}, image built for {pin}"
                       + ("" if status == "ok" else ": rebuild with one nccl.version (`kit build`) and `kit verify`"))
            image_env = _nccl_vars(c.image.attrs["Config"].get("Env"))
            live_env = _nccl_vars(c.attrs["Config"].get("Env"))
            diff = {k: (image_env.get(k), live_env.get(k)) for k in set(image_env) | set(live_env)
                    if k not in expected_env and image_env.get(k) != live_env.get(k)}
            missing = {k: v for k, v in expected_env.items() if live_env.get(k) != v}
            if diff or missing:
                report.add(f"{c.name}-nccl-env", "warn", f"NCCL env differs: image vs container {diff}, "
                                                          f"expected {missing}")
            else:
                report.add(f"{c.name}-nccl-env", "ok", " ".join(f"{k}={v}" for k, v in sorted(live_env.items())))
    logs = "".join(c.logs(tail=3000).decode(errors="replace") for c in containers)
    for f in logscan.scan(logs):
        report.add(f"log-{f.name}", "fail", f"{f.line[:120]} -> {f.advice}")


def check_rpc(config: StackConfig, report: Report) -> None:
    """rpc-server has no authentication: whoever reaches its port runs graphs on that host's GPUs and reads what is
    in their memory (tools/rpc/rpc-server.cpp: "Never expose the RPC server to an open network!"). Said every time,
    a warning when it listens on every interface."""
    from kit import hosts

    workers = hosts.workers(config)
    if not workers:
        return
    port = catalog.get(config.stack.primary).rpc.port
    where = ", ".join(f"{t.name} on {'0.0.0.0' if config.stack.rpc_listen_all else t.address}:{port}"
                      for t in workers)
    if config.stack.rpc_listen_all:
        report.add("rpc", "warn", f"rpc-server has no authentication and listens on every interface: {where}; set "
                   "stack.rpc_listen_all: false, or firewall the port to this machine")
    else:
        report.add("rpc", "ok", f"rpc-server has no authentication: {where}, reachable by anyone on that network; "
                   "keep it private to these hosts")


def run(config: StackConfig, *, docker_info: Callable[[], dict[str, Any] | None] | None = None,
        compose_ok: Callable[[], bool] | None = None, stack: bool = True,
        today: dt.date | None = None) -> Report:
    report = Report()
    check_config(config, report)
    check_rpc(config, report)
    try:
        gpus = nvsmi.gpus()
        if not gpus:
            raise nvsmi.NoDriver("nvidia-smi lists no GPUs")
        links = nvsmi.topology() if len(gpus) > 1 else {}
        driver_cuda = nvsmi.cuda_version()
    except nvsmi.NoDriver as exc:
        report.no_driver = config.hardware.gpus > 0
        report.add("driver", "fail" if report.no_driver else "ok",
                   f"no NVIDIA driver on this machine ({exc})" + ("" if report.no_driver else "; the stack is CPU-only"))
        gpus, links, driver_cuda = [], {}, None
    if gpus:
        check_driver(config, gpus, driver_cuda, report, today or dt.date.today())
        check_gpus(config, gpus, report)
        check_topology(config, links, report)
    check_docker(report, (docker_info or _docker_info)(), (compose_ok or _compose_ok)(), config.hardware.gpus > 0)
    if stack:
        check_stack(config, report)
    return report


def _docker_info() -> dict[str, Any] | None:
    from kit import dockerhost

    try:
        return dockerhost.client().info()
    except KitError:
        return None


def _compose_ok() -> bool:
    from kit import dockerhost

    try:
        dockerhost.compose_cmd()
        return True
    except KitError:
        return False
