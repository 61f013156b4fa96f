"""``kit verify IMAGE``: prove an image keeps kit's promises, from the inside.

A throwaway container (entrypoint overridden to sleep) is inspected with pytest-testinfra's docker backend. Each
check is ok / fail / skip with a reason. The facts to compare against come from the image's own
``/opt/kit/manifest.json``, written during the build.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kit import catalog, dockerhost, fatbin
from kit.config import StackConfig
from kit.errors import KitError

MANIFEST = "/opt/kit/manifest.json"
NCCL_LINKED = "/opt/kit/nccl-linked.txt"  # nccl-linked.sh: what the compile found
# Provided by the NVIDIA driver on the host through the container toolkit, never inside an image.
HOST_DRIVER_LIBS = {"libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1"}
NVIDIA_ENTRYPOINT = "nvidia_entrypoint.sh"
SECRET_PATTERNS = [
    re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"),
    re.compile(r"\bhf_[A-Za-z0-9]{20,}"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    re.compile(r"\bnvapi-[A-Za-z0-9_-]{20,}"),
    re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}"),
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"(?i)\b(api[_-]?key|token|secret|passw(or)?d)\b\s*[=:]\s*['\"]?[^\s'\"$]{8,}"),
]
# a name that says "secret" anywhere: AWS_SECRET_ACCESS_KEY, NGC_API_KEY, HF_TOKEN, DB_PASSWORD, GCP_CREDENTIALS
SECRET_ENV_NAME = re.compile(r"(?i)(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)")
# where credentials get left behind in a filesystem (find -path patterns)
SECRET_FILES = ["*/.cache/huggingface/token", "*/.huggingface/token", "*/.netrc", "*/.docker/config.json",
                "*/.git-credentials", "*/.aws/credentials", "*/.ssh/id_*"]
# key files: flagged when they hold a private key (CA bundles such as certifi's cacert.pem hold certificates only)
KEY_FILES = ["*.pem", "*.key"]
SHELLS = {"sh", "bash", "dash", "ash", "zsh", "ksh", "busybox", "env"}


@dataclass
class Check:
    name: str
    status: str  # ok | fail | skip
    detail: str


class Inspection:
    """One throwaway container plus the image's metadata and manifest. The checks reach the image only through
    ``host`` (testinfra: commands as the image's USER, in its environment), ``config``, ``manifest`` and the methods
    below; ``tests/verifyroot.py`` gives the same surface over an exported root folder, so the mutation benchmark
    runs the adversarial images in milliseconds (and a Docker-tier test holds the two to the same verdicts)."""

    def __init__(self, image: str) -> None:
        import testinfra
        from docker.errors import ImageNotFound

        client = dockerhost.client()
        try:
            self.image = client.images.get(image)
        except ImageNotFound:
            raise KitError("IMAGE", f"no image {image!r} on this Docker daemon", "build it with `kit build`") from None
        self.name = image
        self.config: dict[str, Any] = self.image.attrs.get("Config") or {}
        self.container = client.containers.run(self.image.id, entrypoint=["sleep", "3600"], command=[], detach=True,
                                               network_disabled=True, labels={"io.kit.verify": "1"})
        self.host = testinfra.get_host(f"docker://{self.container.id}")
        self.manifest: dict[str, Any] | None = None
        self.copied: set[str] = set()  # host files put into the container (copy_in)
        self.stack: StackConfig | None = None  # `serves` starts the engine as this stack does
        if self.host.file(MANIFEST).exists:
            self.manifest = json.loads(self.host.file(MANIFEST).content_string)

    def close(self) -> None:
        self.container.remove(force=True)

    def history(self) -> list[dict[str, Any]]:
        """The image's layers as ``docker history`` lists them (``CreatedBy``: the instruction that made each)."""
        return self.image.history()

    def root_output(self, script: str) -> str:
        """``sh -c script`` as root (uid 0) in the image, its stdout: for reads the image's USER may not be allowed."""
        return self.container.exec_run(["sh", "-c", script], user="0").output.decode(errors="replace")

    def copy_out(self, path: str, dest: Path) -> Path:
        stream, _ = self.container.get_archive(path)
        data = io.BytesIO(b"".join(stream))
        with tarfile.open(fileobj=data) as tar:
            member = tar.getmembers()[0]
            handle = tar.extractfile(member)
            target = dest / Path(path).name
            target.write_bytes(handle.read() if handle else b"")
        return target

    def copy_in(self, source: Path, folder: str = "/tmp") -> str:
        """Put a host file (kit's own tools) into the container as an executable, once; its path inside."""
        path = f"{folder}/{source.name}"
        if path not in self.copied:
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                data = source.read_bytes()
                info = tarfile.TarInfo(source.name)
                info.size, info.mode = len(data), 0o755
                tar.addfile(info, io.BytesIO(data))
            self.container.put_archive(folder, buffer.getvalue())
            self.copied.add(path)
        return path


CHECKS: list[tuple[str, Callable[[Inspection], tuple[str, str]]]] = []


def check(name: str):
    def register(fn: Callable[[Inspection], tuple[str, str]]):
        CHECKS.append((name, fn))
        return fn

    return register


def _need_manifest(ins: Inspection) -> dict[str, Any]:
    if ins.manifest is None:
        raise _Skip(f"no {MANIFEST} (not built by kit)")
    return ins.manifest


class _Skip(Exception):
    pass


PROBE_SOURCE = "dockerfile/context/nccl-version.c"
LOADERS = ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1")
PY_PROBE = ("import ctypes, sys; v = ctypes.c_int(); ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(v)); "
            "c = v.value; M = c // 10000 if c >= 10000 else c // 1000; r = c % 10000 if c >= 10000 else c % 1000; "
            "print(f'{M}.{r // 100}.{r % 100}')")


def kit_probe() -> Path | None:
    """kit's own NCCL probe (the source the images compile), built once on this host with its C compiler: the
    check never runs a probe that lives in the image under test. None without a compiler."""
    import hashlib
    import shutil
    import subprocess

    from kit import paths

    source = paths.templates_dir() / PROBE_SOURCE
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    binary = Path.home() / ".cache" / "kit" / f"nccl-probe-{digest}"
    if binary.is_file():
        return binary
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        return None
    binary.parent.mkdir(parents=True, exist_ok=True)
    tmp = binary.with_suffix(".tmp")
    if subprocess.run([cc, "-O2", "-o", str(tmp), str(source), "-ldl"], capture_output=True).returncode != 0:
        return None
    tmp.replace(binary)
    return binary


def nccl_resolved(ins: Inspection, files: list[str]) -> dict[str, list[str]]:
    """libnccl.so.2 as the dynamic loader resolves it for each engine ELF (its RUNPATH/RPATH, the image's
    LD_LIBRARY_PATH, ld.so.conf), asking the image's own loader in trace mode: resolved path -> the engine files
    that load it."""
    loader = next((l for l in LOADERS if ins.host.run(f"test -x {l}").rc == 0), None)
    if loader is None:
        raise RuntimeError("no dynamic loader found in the image")
    found: dict[str, list[str]] = {}
    for path in files:
        # trace mode (what ldd does, without the image's ldd script): a library the host driver provides
        # (libcuda.so.1) prints "not found" instead of stopping the listing, as `ld.so --list` would
        listing = ins.host.run(f"LD_TRACE_LOADED_OBJECTS=1 {loader} {shlex.quote(path)}")
        match = re.search(r"^\s*libnccl\.so\.2 => (\S+)", listing.stdout, flags=re.M)
        if match:
            real = ins.host.run(f"readlink -f {shlex.quote(match.group(1))}").stdout.strip() or match.group(1)
            found.setdefault(real, []).append(path)
    return found


def probe_nccl(ins: Inspection, library: str) -> tuple[str, str]:
    """(version, how) of one NCCL library file, by kit's probe copied into the container; the image's python3 with
    kit's script where this host has no C compiler."""
    probe = kit_probe()
    if probe is not None:
        result = ins.host.run(f"{ins.copy_in(probe)} {shlex.quote(library)}")
        how = "kit's probe"
    else:
        result = ins.host.run(f"python3 -c {shlex.quote(PY_PROBE)} {shlex.quote(library)}")
        how = "kit's ctypes script"
    if result.rc != 0:
        raise RuntimeError((result.stderr or result.stdout).strip()[-200:] or f"{library} does not load")
    return result.stdout.strip(), how


@check("nccl-runtime")
def nccl_runtime(ins: Inspection) -> tuple[str, str]:
    pin = _need_manifest(ins).get("nccl_pin")
    if not pin:
        return "skip", "no NCCL in this flavor"
    files = engine_files(ins)
    resolved = nccl_resolved(ins, files)
    if not resolved and _need_manifest(ins).get("recipe") == "cmake" and files:
        return "fail", f"no engine file links libnccl.so.2, but the image pins NCCL {pin} (built without NCCL?)"
    if not resolved:  # a Python engine (or a stage without the engine) loads NCCL by name: what a dlopen finds
        resolved = {"libnccl.so.2": ["dlopen by name"]}
    versions: dict[str, str] = {}
    how = ""
    for library in resolved:
        try:
            versions[library], how = probe_nccl(ins, library)
        except RuntimeError as exc:
            return "fail", f"{library} does not load: {exc} (manifest pins {pin})"
    if len(set(versions.values())) > 1:
        detail = "; ".join(f"{lib} = {v} (for {', '.join(resolved[lib])})" for lib, v in sorted(versions.items()))
        return "fail", f"two NCCLs for one engine: {detail}"
    (seen,) = set(versions.values())
    if seen != pin:
        lib = next(iter(versions))
        return "fail", (f"the engine loads NCCL {seen} ({lib}, for {', '.join(resolved[lib])}), but the image was built "
                        f"for NCCL {pin}")
    return "ok", f"{', '.join(sorted(versions))}: NCCL {seen} = pin {pin} ({how})"


@check("nccl-builder")
def nccl_builder(ins: Inspection) -> tuple[str, str]:
    """Two kinds of evidence, named as such: the manifest's record (the builder stage's loader probe), and for a
    cmake engine what the compile itself found (its CMakeCache's nccl.h NCCL_VERSION_CODE and libnccl), written by
    the build step that fails on a mismatch. Both live in the image: this check reads them, it cannot re-run the
    builder stage."""
    manifest = _need_manifest(ins)
    pin, built = manifest.get("nccl_pin"), manifest.get("nccl_builder")
    if not pin:
        return "skip", "no NCCL in this flavor"
    if not built or str(built).startswith("@"):
        return "fail", "the build did not record the builder's NCCL"
    if built != pin:
        return "fail", f"the builder compiled against NCCL {built}, but the pin is {pin}"
    record = f"record: the builder stage's loader found NCCL {built} = pin {pin}"
    if manifest.get("recipe") != "cmake":
        return "ok", f"{record} (the engine loads NCCL by name at run time: nccl-runtime is the proof)"
    linked = ins.host.file(NCCL_LINKED)
    if not linked.exists:
        return "fail", (f"{record}, but no {NCCL_LINKED}: the build did not capture what the compile linked "
                        "(an image built before kit recorded it: rebuild it with kit build)")
    found = {}
    for line in linked.content_string.splitlines():
        kind, _, rest = line.partition(" ")
        version, _, path = rest.partition(" ")
        found[kind] = (version, path)
    if set(found) != {"header", "library"}:
        return "fail", f"{NCCL_LINKED} is not the build's record (lines: {sorted(found)})"
    wrong = {kind: v for kind, (v, _) in found.items() if v != pin}
    if wrong:
        detail = ", ".join(f"{kind} {v} ({found[kind][1]})" for kind, v in sorted(wrong.items()))
        return "fail", f"the compile used NCCL {detail}, but the pin is {pin}"
    return "ok", (f"{record}; the compile's nccl.h NCCL_VERSION_CODE and libnccl ({found['library'][1]}) are "
                  f"{pin} (captured by the build)")


@check("entrypoint")
def entrypoint(ins: Inspection) -> tuple[str, str]:
    entry = ins.config.get("Entrypoint")
    if not entry:
        return "fail", "no ENTRYPOINT: the base image's (or a shell) decides what runs"
    if not isinstance(entry, list) or len(entry) == 3 and entry[:2] == ["/bin/sh", "-c"]:
        return "fail", f"shell-form ENTRYPOINT {entry}: use exec form with the engine binary"
    if any(NVIDIA_ENTRYPOINT in part for part in entry):
        return "fail", f"ENTRYPOINT is {entry[0]}: a compose command starting with a flag gets eaten; use the engine binary"
    if Path(entry[0]).name in SHELLS:  # before the manifest: an image can write any manifest it likes
        return "fail", f"ENTRYPOINT runs a shell ({entry[0]}), not the engine: {json.dumps(entry)}"
    expected = (ins.manifest or {}).get("entrypoint")
    if expected and entry != expected:
        return "fail", f"ENTRYPOINT {entry} is not the engine's {expected}"
    binary = ins.host.file(entry[0])
    if not binary.exists or not binary.mode & 0o111:
        return "fail", f"{entry[0]} is missing or not executable"
    magic = ins.host.run(f"head -c 4 {shlex.quote(entry[0])} | od -An -c").stdout.split()
    if magic[:4] != ["177", "E", "L", "F"] and not _declared_script(ins, entry[0]):
        return "fail", f"{entry[0]} is a script, not the engine binary: it may exec anything (or nvidia_entrypoint.sh)"
    return "ok", f"exec form {json.dumps(entry)}"


PYTHON_RECIPES = ("wheel", "torch-source")  # engines pip installs into a venv: their entrypoint is a console script


def _declared_script(ins: Inspection, path: str) -> bool:
    """A Python engine's entrypoint is its console script: allowed when the manifest declares such a recipe and the
    script is pip's, run by the venv's own python (``#!/opt/venv/bin/python``), nothing else."""
    manifest = ins.manifest or {}
    if manifest.get("recipe") not in PYTHON_RECIPES or (manifest.get("entrypoint") or [None])[0] != path:
        return False
    shebang = ins.host.run(f"head -n 1 {shlex.quote(path)}").stdout.strip()
    return bool(re.match(r"#!\S*/python3?(\.\d+)?$", shebang))


def engine_files(ins: Inspection) -> list[str]:
    """Every executable and shared library of the engine, recursively under its install folder (the manifest's
    ``prefix``, else the entrypoint's folder), symlinks resolved, each once: where the engine loads code from."""
    entry = ins.config.get("Entrypoint") or []
    if not entry:
        return []
    # the entrypoint's folder always (a forged manifest cannot point the scan away from it), and a cmake engine's
    # recorded install folder; a Python engine's venv is scanned by the checks that need it
    folders = {str(Path(entry[0]).parent)}
    if (ins.manifest or {}).get("recipe") == "cmake" and (ins.manifest or {}).get("prefix"):
        folders.add(str(ins.manifest["prefix"]))
    where = " ".join(shlex.quote(f) for f in sorted(folders))
    found = ins.host.run(f"find -L {where} -type f \\( -perm -u+x -o -name '*.so*' \\) "
                         f"-exec readlink -f {{}} \\; 2>/dev/null | sort -u")
    files = [line for line in found.stdout.splitlines() if line]
    if entry[0] not in files:
        files.insert(0, entry[0])
    return files


@check("libs")
def libs(ins: Inspection) -> tuple[str, str]:
    files = [f for f in engine_files(ins) if ins.host.run(f"head -c 4 {shlex.quote(f)} | grep -q ELF").rc == 0]
    if not files:
        return "skip", "no ELF files next to the entrypoint (a Python engine)"
    missing: dict[str, set[str]] = {}
    driver: set[str] = set()
    for path in files:
        out = ins.host.run(f"ldd {shlex.quote(path)}").stdout
        for lib in re.findall(r"^\s*(\S+) => not found", out, flags=re.M):
            (driver.add(lib) if lib in HOST_DRIVER_LIBS else missing.setdefault(lib, set()).add(Path(path).name))
    if missing:
        worst = ", ".join(f"{lib} (needed by {', '.join(sorted(by))})" for lib, by in sorted(missing.items()))
        return "fail", f"unresolved: {worst}"
    note = f"; from the host driver: {', '.join(sorted(driver))}" if driver else ""
    return "ok", f"{len(files)} ELF files resolve{note}"


@check("cuda-arch")
def cuda_arch(ins: Inspection) -> tuple[str, str]:
    manifest = _need_manifest(ins)
    expected = sorted(int(a) for a in manifest.get("archs") or [])
    if not expected:
        return "skip", "cpu flavor: no device code"
    python = manifest.get("recipe") in PYTHON_RECIPES
    venv = manifest.get("prefix") or "/opt/venv"
    files = python_extensions(ins, venv, manifest.get("package") or "") if python else engine_files(ins)
    found: dict[str, dict[str, list[int]]] = {}
    unreadable: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in files:
            local = ins.copy_out(path, Path(tmp))
            try:
                archs = fatbin.archs(local)
            except fatbin.FatbinError as exc:
                if local.read_bytes()[:4] == b"\x7fELF":  # an ELF whose device code cannot be read: never skipped
                    unreadable.append(f"{path} ({exc})")
                continue
            finally:
                local.unlink(missing_ok=True)
            if archs["sass"] or archs["ptx"]:
                found[path] = archs
    if unreadable:
        return "fail", f"device code that cannot be read: {', '.join(unreadable)}"
    if not found:
        return "fail", f"no CUDA device code found; expected sm_{expected}"
    wrong = {name: a["sass"] for name, a in found.items() if a["sass"] != expected}
    if wrong:
        detail = ", ".join(f"{name}: sm {sass or 'none (PTX only)'}" for name, sass in sorted(wrong.items()))
        return "fail", f"expected real code for exactly sm {expected}; {detail}"
    ptx = {name: a["ptx"] for name, a in found.items() if a["ptx"]}
    if ptx:
        detail = ", ".join(f"{name}: compute {archs}" for name, archs in sorted(ptx.items()))
        return "fail", f"PTX beside the real code ({detail}): kit builds real code only (`-real` archs)"
    torch = _torch_archs(ins, venv, expected) if python else ("ok", "")
    if torch[0] != "ok":
        return torch
    return "ok", f"{len(found)} files carry real code for sm {expected} only, no PTX{torch[1]}"


def python_extensions(ins: Inspection, venv: str, package: str) -> list[str]:
    """A Python engine's device code: the extension modules of its own package in the venv (vLLM's _C, _moe_C,
    ...). The venv also holds torch's and the nvidia-* wheels' libraries, built for every arch by others: torch is
    judged by its own arch list (_torch_archs), the CUDA libraries are not the engine's build."""
    if not package:
        return []
    found = ins.host.run(f"find -L {shlex.quote(venv)}/lib -path '*/site-packages/{package}/*' -name '*.so*' "
                         "-type f 2>/dev/null | sort -u")
    return [line for line in found.stdout.splitlines() if line]


def _torch_archs(ins: Inspection, venv: str, expected: list[int]) -> tuple[str, str]:
    """The torch in the venv must carry kernels for the GPUs (the build asserted it before compiling; the image may
    have changed torch since). torch._C._cuda_getArchFlags() is torch's own record and needs no GPU."""
    python = f"{venv}/bin/python"
    probe = ins.host.run(f"{shlex.quote(python)} -c 'import torch; print(torch.__version__); "
                         f"print(torch._C._cuda_getArchFlags())'")
    lines = probe.stdout.strip().splitlines()  # stderr has torch's warnings (no numpy, no driver)
    if probe.rc != 0:
        if "No module named 'torch'" in probe.stderr:
            return "ok", ""  # an engine without torch (a wheel engine may bring its own kernels only)
        return "fail", f"cannot ask torch for its archs: {(probe.stderr.strip().splitlines() or ['no output'])[-1][:200]}"
    version, flags = lines[0], (lines[1] if len(lines) > 1 else "").split()
    missing = [f"sm_{a}" for a in expected if f"sm_{a}" not in flags]
    if missing:
        return "fail", f"torch {version} was built for {' '.join(flags) or 'no CUDA arch'}, not {' '.join(missing)}"
    return "ok", f"; torch {version} carries {' '.join(f'sm_{a}' for a in expected)} (of {' '.join(flags)})"


@check("runs")
def runs(ins: Inspection) -> tuple[str, str]:
    entry = ins.config.get("Entrypoint") or []
    manifest = ins.manifest or {}
    cmd: list[str] = []
    if manifest.get("engine") in catalog.all_engines():
        cmd = catalog.get(manifest["engine"]).version_cmd
    cmd = cmd or ([entry[0], "--version"] if entry else [])
    if not cmd:
        return "fail", "nothing to run"
    result = ins.host.run("timeout 60 " + " ".join(shlex.quote(c) for c in cmd))
    text = (result.stdout + result.stderr).strip()
    driver_lib = next((lib for lib in HOST_DRIVER_LIBS if lib in text), None)
    if result.rc != 0 and driver_lib:
        return "skip", f"needs {driver_lib} from the NVIDIA driver to start; run `kit verify` on the GPU host"
    if result.rc != 0 or not text:
        return "fail", f"`{' '.join(cmd)}` exited {result.rc}: {text[-200:]}"
    return "ok", f"`{' '.join(cmd)}`: {text.splitlines()[0][:100]}"


@check("user")
def user(ins: Inspection) -> tuple[str, str]:
    declared = (ins.config.get("User") or "").split(":")[0]
    uid = ins.host.run("id -u").stdout.strip()  # the throwaway container runs as the image's USER
    if not uid.isdigit():
        raise RuntimeError(f"`id -u` gave {uid!r}")
    if uid == "0":
        return "fail", f"runs as uid 0 (USER {declared or 'unset'}); add a non-root USER"
    return "ok", f"runs as uid {uid}" + (f" ({declared})" if declared and declared != uid else "")


def _healthcheck_test(ins: Inspection) -> list[str]:
    """The image's HEALTHCHECK test (``["CMD", ...]`` or ``["CMD-SHELL", "..."]``); empty when there is none."""
    test = (ins.config.get("Healthcheck") or {}).get("Test") or []
    return [] if not test or test[0] == "NONE" else test


@check("healthcheck")
def healthcheck(ins: Inspection) -> tuple[str, str]:
    test = _healthcheck_test(ins)
    if not test:
        return "fail", "no HEALTHCHECK"
    argv = test[1:] if test[0] == "CMD" else shlex.split(" ".join(test[1:]))  # CMD-SHELL: its first word
    program = argv[0] if argv else ""
    where = ins.host.run(f"command -v {shlex.quote(program)} || test -x {shlex.quote(program)}")
    if not program or where.rc != 0:
        return "fail", f"the healthcheck runs {program!r}, which is not in the image"
    # the throwaway container runs `sleep`, not the engine: a healthcheck that passes now cannot tell a dead engine
    down = ins.host.run("timeout 20 " + (" ".join(shlex.quote(a) for a in argv) if test[0] == "CMD"
                                          else "sh -c " + shlex.quote(" ".join(test[1:]))))
    if down.rc == 0:
        return "fail", f"the healthcheck passes with no engine running ({' '.join(test[1:])[:80]}): it proves nothing"
    return "ok", f"{' '.join(test[1:])[:100]} (fails while the engine is down)"


@check("serves")
def serves(ins: Inspection) -> tuple[str, str]:
    """The engine started as the stack starts it (its argv, its model folder read-only), with the image's own
    HEALTHCHECK test polled every second: healthy within the stack's start period, or why not."""
    import time

    from kit import compose, deploy, resolve, serving

    if ins.stack is None:
        raise _Skip("pass --serve (with -c kit.yaml) to start the engine on the stack's model")
    test = _healthcheck_test(ins)
    if not test:
        return "fail", "no HEALTHCHECK to wait for"
    engine = _need_manifest(ins).get("engine", "")
    resolved = resolve.engine(ins.stack, engine)
    argv, timeout_s = list(resolved.argv), resolved.start_period_s
    container = dockerhost.client().containers.run(
        ins.image.id, command=argv, detach=True, labels={"io.kit.verify": "1"},
        volumes={compose.host_model_dir(ins.stack): {"bind": serving.MODEL_MOUNT, "mode": "ro"}},
        healthcheck={"Test": test, "Interval": 1_000_000_000, "Timeout": 5_000_000_000, "Retries": 3,
                     "StartPeriod": int(timeout_s * 1e9)})
    try:
        started, status = time.monotonic(), ""
        while time.monotonic() < started + timeout_s:
            status = deploy.health(container)  # the compose stack's own reading of a container's state
            if status == "healthy":
                return "ok", f"healthy {time.monotonic() - started:.0f} s after start ({' '.join(test[1:])[:60]})"
            if status == "exited":
                break
            time.sleep(1)
        last = container.logs(tail=3).decode(errors="replace").strip().splitlines()
        why = (f"exited {container.attrs['State'].get('ExitCode')}" if status == "exited"
               else f"was not healthy within {timeout_s} s")
        return "fail", f"the engine {why}: {(last or ['no log'])[-1][:160]}"
    finally:
        container.remove(force=True)


@check("secrets")
def secrets(ins: Inspection) -> tuple[str, str]:
    hits: list[str] = []
    for item in ins.config.get("Env") or []:
        key, _, value = item.partition("=")
        if value and SECRET_ENV_NAME.search(key):
            hits.append(f"env {key}")
        elif any(p.search(item) for p in SECRET_PATTERNS):
            hits.append(f"env {key}")
    for key, value in (ins.config.get("Labels") or {}).items():
        if any(p.search(f"{key}={value}") for p in SECRET_PATTERNS):
            hits.append(f"label {key}")
    for layer in ins.history():
        created = layer.get("CreatedBy") or ""
        if any(p.search(created) for p in SECRET_PATTERNS):
            hits.append(f"history: {created.strip()[:80]}")
    hits += [f"file {line}" for line in _secret_files(ins)]
    if hits:
        return "fail", "key-like values in " + "; ".join(hits[:5])
    return "ok", "no key-like values in env, labels, history or credential files"


def _secret_files(ins: Inspection) -> list[str]:
    """Credential files anywhere in the image, searched as root (a token in /root is still in the image)."""
    prune = "find / -xdev \\( -path /proc -o -path /sys \\) -prune -o -type f"
    named = " -o ".join(f"-path {shlex.quote(p)}" for p in SECRET_FILES)
    keys = " -o ".join(f"-name {shlex.quote(p)}" for p in KEY_FILES)
    script = (f"{prune} \\( {named} \\) -size +0 -print 2>/dev/null; "
              f"{prune} \\( {keys} \\) -exec grep -l 'PRIVATE KEY-----' {{}} + 2>/dev/null")
    return [line for line in ins.root_output(script).splitlines() if line.startswith("/")]


def verify(image: str, only: list[str] | None = None, stack: StackConfig | None = None,
           inspection: Callable[[str], Inspection] = Inspection) -> list[Check]:
    known = [name for name, _ in CHECKS]
    unknown = [name for name in only or [] if name not in known]
    if unknown:  # an empty table that exits 0 would read as "all fine"
        raise KitError("--check", f"unknown check {unknown[0]!r}", f"use one of {', '.join(known)}")
    ins = inspection(image)
    ins.stack = stack
    results: list[Check] = []
    try:
        for name, fn in CHECKS:
            if only and name not in only:
                continue
            try:
                status, detail = fn(ins)
            except _Skip as skip:
                status, detail = "skip", str(skip)
            except Exception as exc:  # noqa: BLE001 - one broken check reports, the others still run
                status, detail = "error", f"{exc.__class__.__name__}: {str(exc)[:200]}"
            results.append(Check(name, status, detail))
    finally:
        ins.close()
    return results


def as_json(results: list[Check]) -> str:
    return json.dumps([asdict(r) for r in results], indent=2)
