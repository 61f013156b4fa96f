"""`kit verify` against images built to fool it: each carries exactly one defect and must fail that check, for
that reason. The control image (same recipe, no defect) passes the same checks. Needs Docker (CI: required).

The images are made from the kit base (`kit base`, no Docker Hub) in seconds: a fake engine is a copy of an ELF
binary from the base (`/usr/bin/true`), so no compiler is needed.

Every image is verified twice: in a container (the real `kit verify`) and over its exported root
(`tests/verifyroot.py`), and the two must give the same verdicts and details. With ``KIT_VERIFY_ROOTS=DIR`` (the
mutation benchmark) the roots are kept in DIR and, once there, used alone: no build, no container.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import tempfile
from dataclasses import asdict
from pathlib import Path

import pytest

from kit import verify
from tests import verifyroot

pytestmark = [pytest.mark.docker]
ROOTS = os.environ.get("KIT_VERIFY_ROOTS")  # the mutation benchmark's folder of exported roots


def root_of(tag: str) -> Path:
    return Path(ROOTS or "") / tag.split(":", 1)[1]


def checked(client, tag: str, checks: list[str]) -> list[verify.Check]:
    """The verdicts of ``checks`` on ``tag``: the container's, which the exported root's must equal."""
    if ROOTS:
        folder = verifyroot.export(client, tag, root_of(tag))
        return verify.verify(str(folder), checks, inspection=verifyroot.RootInspection)
    results = verify.verify(tag, checks)
    with tempfile.TemporaryDirectory(prefix="kit-root-") as tmp:
        stand_in = verify.verify(str(verifyroot.export(client, tag, Path(tmp))), checks,
                                 inspection=verifyroot.RootInspection)
    assert [asdict(r) for r in stand_in] == [asdict(r) for r in results], "the exported root disagrees"
    return results

GOOD = """
FROM {base}
RUN cp /usr/bin/true /app-engine && mkdir -p /app /opt/kit && mv /app-engine /app/llama-server \\
 && useradd -u 10001 -m kit && cp /etc/ssl/certs/ca-certificates.crt /opt/kit/cacert.pem
COPY manifest.json /opt/kit/manifest.json
USER 10001
HEALTHCHECK CMD ["test", "-e", "/tmp/engine-is-up"]
ENTRYPOINT ["/app/llama-server"]
"""
MANIFEST = {"engine": "llama.cpp", "recipe": "cmake", "entrypoint": ["/app/llama-server"], "nccl_pin": None}

# name -> (Dockerfile lines appended to GOOD, the check that must fail, a phrase its reason must contain[, a forged
# manifest: the image says whatever helps it pass])
DEFECTS = {
    "root-by-name-uid-0": ('USER root', "user", "uid 0"),
    "user-named-kit-with-uid-0": ('USER 0\nRUN useradd -o -u 0 -M fakekit\nUSER fakekit', "user", "uid 0"),
    "shell-form": ("ENTRYPOINT /app/llama-server --flag", "entrypoint", "shell-form"),
    "bash-wrapper": ('ENTRYPOINT ["/bin/bash", "-lc", "exec /app/llama-server \\"$@\\""]', "entrypoint", "shell",
                     {"entrypoint": ["/bin/bash", "-lc", "exec /app/llama-server \"$@\""]}),
    "dash-wrapper": ('ENTRYPOINT ["/usr/bin/dash", "-c", "/app/llama-server"]', "entrypoint", "shell",
                     {"entrypoint": ["/usr/bin/dash", "-c", "/app/llama-server"]}),
    "script-entrypoint": ('USER root\nRUN printf "#!/bin/sh\\nexec /opt/nvidia/nvidia_entrypoint.sh \\"\\$@\\"\\n" '
                          '> /app/start && chmod +x /app/start\nUSER 10001\nENTRYPOINT ["/app/start"]',
                          "entrypoint", "is a script", {"entrypoint": ["/app/start"], "recipe": "wheel"}),
    "aws-secret-env": ("ENV AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY", "secrets",
                       "env AWS_SECRET_ACCESS_KEY"),
    "ngc-key-env": ("ENV NGC_API_KEY=nvapi-abcdefghijklmnopqrstuvwxyz0123", "secrets", "env NGC_API_KEY"),
    "gitlab-token-in-label": ('LABEL note="deploy with glpat-abcdefghijklmnopqrst12"', "secrets", "label note"),
    "hf-token-file": ("USER root\nRUN mkdir -p /home/kit/.cache/huggingface && "
                      "echo hf_abcdefghijklmnopqrstuvwxyz > /home/kit/.cache/huggingface/token\nUSER 10001",
                      "secrets", ".cache/huggingface/token"),
    "git-credentials-file": ("USER root\nRUN echo https://u:p@example.invalid > /root/.git-credentials\nUSER 10001",
                             "secrets", ".git-credentials"),
    "private-key-file": ("USER root\nRUN mkdir -p /opt/tls && printf -- '-----BEGIN RSA PRIVATE KEY-----\\nMIIEow\\n"
                         "-----END RSA PRIVATE KEY-----\\n' > /opt/tls/server.pem\nUSER 10001", "secrets",
                         "/opt/tls/server.pem"),
    "no-healthcheck": ('HEALTHCHECK NONE', "healthcheck", "no HEALTHCHECK"),
    "healthcheck-always-passes": ('HEALTHCHECK CMD ["/app/llama-server"]', "healthcheck",
                                  "passes with no engine running"),
    "healthcheck-shell-always-passes": ('HEALTHCHECK CMD curl -fsS http://127.0.0.1:8080/health || exit 0',
                                        "healthcheck", "the healthcheck runs 'curl', which is not in the image"),
    "healthcheck-program-missing": ('HEALTHCHECK CMD ["curl", "-fsS", "http://127.0.0.1:8080/health"]', "healthcheck",
                                    "the healthcheck runs 'curl', which is not in the image"),
    "healthcheck-shell-program-missing": ('HEALTHCHECK CMD wget -q -O- http://127.0.0.1:8080/health', "healthcheck",
                                          "the healthcheck runs 'wget', which is not in the image"),
}


def build(client, base: str, name: str, extra: str = "", forged: dict | None = None,
          files: dict[str, bytes] | None = None) -> str:
    dockerfile = GOOD.format(base=base) + extra + "\n"
    manifest = {**MANIFEST, **(forged or {})}
    return build_context(client, name, {"Dockerfile": dockerfile.encode(),
                                        "manifest.json": json.dumps(manifest).encode(), **(files or {})})


def build_context(client, name: str, files: dict[str, bytes]) -> str:
    """``kit/test-verify:<name>`` built from a context held in memory (relative path -> bytes, with a Dockerfile)."""
    tag = f"kit/test-verify:{name}"
    if ROOTS and (root_of(tag) / "image.json").is_file():
        return tag  # exported by an earlier run of the benchmark: no build
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for fname, data in files.items():
            info = tarfile.TarInfo(fname)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    client.images.build(fileobj=buffer, custom_context=True, tag=tag, rm=True)
    return tag


CHECKED = sorted({defect[1] for defect in DEFECTS.values()})


def test_control_image_passes(docker_ready, base_image):
    tag = build(docker_ready, base_image, "good")
    results = {r.name: r for r in checked(docker_ready, tag, CHECKED)}
    for name in CHECKED:
        assert results[name].status == "ok", (name, results[name].detail)


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_one_defect_fails_its_check(defect, docker_ready, base_image):
    extra, check, reason, *forged = DEFECTS[defect]
    tag = build(docker_ready, base_image, defect, extra, *forged)
    (result,) = checked(docker_ready, tag, [check])
    assert result.status == "fail", (defect, result.detail)
    assert reason in result.detail, (defect, result.detail)


# ---- cuda-arch: real CUDA objects (tests/fixtures/fatbin, compiled with Debian's nvcc 11.8) placed where an
# engine's code lives; the manifest says sm_70, as a kit image for V100s would.
FATBIN = Path(__file__).parent / "fixtures" / "fatbin"
CUDA_MANIFEST = {"archs": [70], "recipe": "cmake", "prefix": "/app"}
CUDA_GOOD = "USER root\nCOPY sm70.so /app/libggml-cuda.so\nUSER 10001"
CUDA_DEFECTS = {  # name -> (Dockerfile lines, files from the fixtures, the reason's phrase[, manifest forgeries])
    "sass-plus-ptx": ("USER root\nCOPY sm70_ptx70.so /app/libggml-cuda.so\nUSER 10001", ["sm70_ptx70.so"],
                      "PTX beside the real code (/app/libggml-cuda.so: compute [70])"),
    "wrong-arch-in-a-subfolder": (CUDA_GOOD + "\nUSER root\nCOPY sm80.so /app/lib/extra/libggml-extra.so\nUSER 10001",
                                  ["sm70.so", "sm80.so"], "/app/lib/extra/libggml-extra.so: sm [80]"),
    "wrong-arch-behind-a-symlink": ("USER root\nCOPY sm80.so /opt/elsewhere/libreal.so\n"
                                    "RUN ln -s /opt/elsewhere/libreal.so /app/libggml-cuda.so\nUSER 10001",
                                    ["sm80.so"], "/opt/elsewhere/libreal.so: sm [80]"),
    "ptx-only": ("USER root\nCOPY ptx70.so /app/libggml-cuda.so\nUSER 10001", ["ptx70.so"],
                 "/app/libggml-cuda.so: sm none (PTX only)"),
    "forged-prefix-hides-nothing": (CUDA_GOOD + "\nUSER root\nCOPY sm80.so /app/libggml-rpc.so\nUSER 10001",
                                    ["sm70.so", "sm80.so"], "/app/libggml-rpc.so: sm [80]", {"prefix": "/nowhere"}),
    # a cmake engine's recorded install folder is scanned too, not only the entrypoint's
    "wrong-arch-under-the-recorded-prefix": (CUDA_GOOD + "\nUSER root\nCOPY sm80.so /opt/llama/lib/libggml-extra.so\n"
                                             "USER 10001", ["sm70.so", "sm80.so"],
                                             "/opt/llama/lib/libggml-extra.so: sm [80]", {"prefix": "/opt/llama"}),
}
FIXTURE_FOR = {"sm70.so": "sm70.o", "sm80.so": "sm80.o", "ptx70.so": "ptx70.o", "sm70_ptx70.so": "sm70_ptx70.o"}


def cuda_files(names: list[str]) -> dict[str, bytes]:
    return {name: (FATBIN / FIXTURE_FOR[name]).read_bytes() for name in names}


def test_cuda_control_image_passes(docker_ready, base_image):
    tag = build(docker_ready, base_image, "cuda-good", CUDA_GOOD, CUDA_MANIFEST, cuda_files(["sm70.so"]))
    (result,) = checked(docker_ready, tag, ["cuda-arch"])
    assert result.status == "ok" and "real code for sm [70] only, no PTX" in result.detail, result.detail


@pytest.mark.parametrize("defect", sorted(CUDA_DEFECTS))
def test_cuda_defect_fails_cuda_arch(defect, docker_ready, base_image):
    extra, names, reason, *forged = CUDA_DEFECTS[defect]
    tag = build(docker_ready, base_image, defect, extra, {**CUDA_MANIFEST, **(forged[0] if forged else {})},
                cuda_files(names))
    (result,) = checked(docker_ready, tag, ["cuda-arch"])
    assert result.status == "fail", (defect, result.detail)
    assert reason in result.detail, (defect, result.detail)


def test_static_executable_with_the_wrong_arch(docker_ready, base_image, tmp_path):
    """A statically linked CUDA program (cudart static, sm_80) beside the engine: its device code counts too."""
    from tests.conftest import require
    from tests.test_fatbin import NVCC, TOOLKIT_PATH

    require("NVCC", NVCC is not None, "no CUDA 11/12 nvcc (Debian's nvidia-cuda-toolkit)")
    (tmp_path / "tool.cu").write_text("__global__ void k(float *x) { x[threadIdx.x] *= 2.0f; }\n"
                                      "int main() { return 0; }\n")
    subprocess.run([NVCC, "-gencode", "arch=compute_80,code=sm_80", "-cudart", "static", "tool.cu", "-o", "tool"],
                   cwd=tmp_path, check=True, capture_output=True, env={"PATH": TOOLKIT_PATH})
    files = {**cuda_files(["sm70.so"]), "tool": (tmp_path / "tool").read_bytes()}
    tag = build(docker_ready, base_image, "static-executable",
                CUDA_GOOD + "\nUSER root\nCOPY tool /app/llama-tool\nRUN chmod +x /app/llama-tool\nUSER 10001",
                CUDA_MANIFEST, files)
    (result,) = checked(docker_ready, tag, ["cuda-arch"])
    assert result.status == "fail" and "/app/llama-tool: sm [80]" in result.detail, result.detail


def test_device_code_that_cannot_be_read_is_reported(docker_ready, base_image, tmp_path):
    """An ELF whose .nv_fatbin section is garbage: reported by name, never skipped as 'no device code'."""
    import shutil

    from tests.conftest import require

    objcopy = shutil.which("objcopy")
    require("GCC", objcopy is not None, "no objcopy (binutils)")
    (tmp_path / "garbage").write_bytes(b"\xde\xad\xbe\xef" * 64)
    subprocess.run([objcopy, "--add-section", f".nv_fatbin={tmp_path / 'garbage'}", "/usr/bin/true",
                    str(tmp_path / "lib.so")], check=True, capture_output=True)
    files = {**cuda_files(["sm70.so"]), "bad.so": (tmp_path / "lib.so").read_bytes()}
    tag = build(docker_ready, base_image, "unreadable-fatbin",
                CUDA_GOOD + "\nUSER root\nCOPY bad.so /app/libggml-bad.so\nUSER 10001", CUDA_MANIFEST, files)
    (result,) = checked(docker_ready, tag, ["cuda-arch"])
    assert result.status == "fail" and "/app/libggml-bad.so" in result.detail, result.detail
    assert "cannot be read" in result.detail


# ---- nccl-runtime: stub libnccl.so.2 files (gcc, ncclGetVersion returns a chosen NCCL_VERSION_CODE) and a fake engine
# library that links it; the check must ask the loader what each engine file resolves, and probe that file with
# kit's own probe (an image's kit-nccl-version may lie).
NCCL_MANIFEST = {"nccl_pin": "2.27.3", "recipe": "cmake", "prefix": "/app"}
NCCL_GOOD = ("USER root\nCOPY nccl-a/ /opt/kit/nccl/\nCOPY nccl-b/ /opt/other/\nCOPY libggml-cuda.so /app/\n"
             "RUN echo /opt/kit/nccl > /etc/ld.so.conf.d/000-kit-nccl.conf && ldconfig\nUSER 10001")
NCCL_DEFECTS = {  # name -> (Dockerfile lines after NCCL_GOOD, engine libraries: name -> RUNPATH, reason)
    "nccl-by-runpath": ("", {"libggml-cuda.so": "/opt/other"},
                        "the engine loads NCCL 2.32.3 (/opt/other/libnccl.so.2, for /app/libggml-cuda.so)"),
    "nccl-by-ld-library-path": ("ENV LD_LIBRARY_PATH=/opt/other", {"libggml-cuda.so": ""},
                                "the engine loads NCCL 2.32.3 (/opt/other/libnccl.so.2"),
    "nccl-by-ld-so-conf": ("USER root\nRUN echo /opt/other > /etc/ld.so.conf.d/000-aaa.conf && ldconfig\nUSER 10001",
                           {"libggml-cuda.so": ""}, "the engine loads NCCL 2.32.3 (/opt/other/libnccl.so.2"),
    "two-nccls": ("USER root\nCOPY libggml-rpc.so /app/\nUSER 10001",
                  {"libggml-cuda.so": "", "libggml-rpc.so": "/opt/other"}, "two NCCLs for one engine"),
    # pinned, but the engine links no NCCL at all (GGML_CUDA_NCCL off): the pin proves nothing
    "no-nccl-linked": ("USER root\nRUN cp /usr/bin/true /app/libggml-cuda.so\nUSER 10001", {"libggml-cuda.so": ""},
                       "no engine file links libnccl.so.2, but the image pins NCCL 2.27.3"),
    # the image's own probe says what the manifest wants; the loader says otherwise
    "forged-probe": ("USER root\nRUN printf '#!/bin/sh\\necho 2.27.3\\n' > /usr/local/bin/kit-nccl-version "
                     "&& chmod +x /usr/local/bin/kit-nccl-version\nUSER 10001",
                     {"libggml-cuda.so": "/opt/other"}, "the engine loads NCCL 2.32.3"),
}


@pytest.fixture(scope="module")
def nccl_parts(tmp_path_factory):
    """Stub NCCLs 2.27.3 (a) and 2.32.3 (b), and a builder for engine libraries that link libnccl.so.2."""
    import shutil

    from tests.conftest import require

    gcc = shutil.which("gcc") or shutil.which("cc")
    require("GCC", gcc is not None, "no C compiler (apt-get install gcc)")
    root = tmp_path_factory.mktemp("nccl")
    for name, code in (("nccl-a", 22703), ("nccl-b", 23203)):
        (root / name).mkdir()
        (root / f"{name}.c").write_text(f"int ncclGetVersion(int *v) {{ *v = {code}; return 0; }}\n")
        subprocess.run([gcc, "-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o", str(root / name / "libnccl.so.2"),
                        str(root / f"{name}.c")], check=True)
    (root / "engine.c").write_text("int ncclGetVersion(int *);\nint cuInit(unsigned);\n"
                                   "int ggml_nccl(void) { int v; return ncclGetVersion(&v) + cuInit(0); }\n")
    # like the real libggml-cuda.so, the engine library also needs libcuda.so.1, which only the host driver provides:
    # a stub at link time, absent from the image
    (root / "driver").mkdir()
    (root / "cuda.c").write_text("int cuInit(unsigned f) { return (int) f; }\n")
    subprocess.run([gcc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(root / "driver" / "libcuda.so.1"),
                    str(root / "cuda.c")], check=True)

    def engine_lib(runpath: str) -> bytes:
        out = root / f"engine-{abs(hash(runpath))}.so"
        flags = [f"-Wl,-rpath,{runpath}", "-Wl,--disable-new-dtags"] if runpath else []
        subprocess.run([gcc, "-shared", "-fPIC", "-o", str(out), str(root / "engine.c"), f"-L{root / 'nccl-a'}",
                        "-l:libnccl.so.2", f"-L{root / 'driver'}", "-l:libcuda.so.1", *flags], check=True)
        return out.read_bytes()

    files = {f"{n}/libnccl.so.2": (root / n / "libnccl.so.2").read_bytes() for n in ("nccl-a", "nccl-b")}
    return files, engine_lib


def test_nccl_behind_a_symlink_is_named_by_its_real_file(docker_ready, base_image, nccl_parts):
    """The loader resolves libnccl.so.2, a link (as ldconfig makes them) to the versioned file: the check names the
    file it probed."""
    files, engine_lib = nccl_parts
    tag = build(docker_ready, base_image, "nccl-symlink", NCCL_GOOD + "\nUSER root\nRUN mv /opt/kit/nccl/libnccl.so.2 "
                "/opt/kit/nccl/libnccl.so.2.27.3 && ldconfig && test -L /opt/kit/nccl/libnccl.so.2\nUSER 10001",
                NCCL_MANIFEST, {**files, "libggml-cuda.so": engine_lib("")})
    (result,) = checked(docker_ready, tag, ["nccl-runtime"])
    assert (result.status, result.detail) == ("ok", "/opt/kit/nccl/libnccl.so.2.27.3: NCCL 2.27.3 = pin 2.27.3 "
                                                    "(kit's probe)")


def test_nccl_control_image_passes(docker_ready, base_image, nccl_parts):
    files, engine_lib = nccl_parts
    tag = build(docker_ready, base_image, "nccl-good", NCCL_GOOD, NCCL_MANIFEST,
                {**files, "libggml-cuda.so": engine_lib("")})
    (result,) = checked(docker_ready, tag, ["nccl-runtime"])
    assert result.status == "ok", result.detail
    assert result.detail == "/opt/kit/nccl/libnccl.so.2: NCCL 2.27.3 = pin 2.27.3 (kit's probe)"


@pytest.mark.parametrize("defect", sorted(NCCL_DEFECTS))
def test_nccl_defect_fails_nccl_runtime(defect, docker_ready, base_image, nccl_parts):
    files, engine_lib = nccl_parts
    extra, libs, reason = NCCL_DEFECTS[defect]
    context = {**files, **{name: engine_lib(runpath) for name, runpath in libs.items()}}
    tag = build(docker_ready, base_image, defect, NCCL_GOOD + "\n" + extra, NCCL_MANIFEST, context)
    (result,) = checked(docker_ready, tag, ["nccl-runtime"])
    assert result.status == "fail", (defect, result.detail)
    assert reason in result.detail, (defect, result.detail)


# ---- nccl-builder: the manifest's record plus what the compile found (nccl-linked.sh's file); the image writes both,
# so each forgery below must be caught by the two disagreeing with each other or with the pin.
LINKED_OK = ("header 2.27.3 /opt/kit/nccl/nvidia/nccl/include/nccl.h\n"
             "library 2.27.3 /opt/kit/nccl/nvidia/nccl/lib/libnccl.so\n")
BUILDER_MANIFEST = {"nccl_pin": "2.27.3", "nccl_builder": "2.27.3", "recipe": "cmake"}
BUILDER_CASES = {  # name -> (nccl-linked.txt or None, manifest changes, status, phrase)
    "good": (LINKED_OK, {}, "ok", "the compile's nccl.h NCCL_VERSION_CODE and libnccl "
                                  "(/opt/kit/nccl/nvidia/nccl/lib/libnccl.so) are 2.27.3"),
    "no-compile-record": (None, {}, "fail", "no /opt/kit/nccl-linked.txt"),
    "header-from-the-devel-image": (LINKED_OK.replace("header 2.27.3 /opt/kit/nccl/nvidia/nccl/include",
                                                      "header 2.26.2 /usr/include"), {}, "fail",
                                    "the compile used NCCL header 2.26.2 (/usr/include/nccl.h), but the pin is 2.27.3"),
    "library-from-elsewhere": (LINKED_OK.replace("library 2.27.3", "library 2.32.3"), {}, "fail",
                               "library 2.32.3"),
    "garbage-record": ("2.27.3\n", {}, "fail", "is not the build's record"),
    "record-says-another": (LINKED_OK, {"nccl_builder": "2.26.2"}, "fail",
                            "the builder compiled against NCCL 2.26.2, but the pin is 2.27.3"),
    "record-placeholder-left": (LINKED_OK, {"nccl_builder": "@NCCL_BUILDER@"}, "fail", "did not record"),
}


@pytest.mark.parametrize("case", sorted(BUILDER_CASES))
def test_nccl_builder_reads_both_records_and_names_them(case, docker_ready, base_image):
    linked, forged, status, phrase = BUILDER_CASES[case]
    extra = "USER root\nCOPY nccl-linked.txt /opt/kit/\nUSER 10001" if linked is not None else ""
    files = {"nccl-linked.txt": linked.encode()} if linked is not None else {}
    tag = build(docker_ready, base_image, f"builder-{case}", extra, {**BUILDER_MANIFEST, **forged}, files)
    (result,) = checked(docker_ready, tag, ["nccl-builder"])
    assert result.status == status and phrase in result.detail, (case, result.detail)
    if status == "ok":
        assert result.detail.startswith("record: the builder stage's loader found NCCL 2.27.3 = pin 2.27.3; ")


# ---- Python engines (recipes wheel and torch-source): the engine's extension modules in a venv, a console script as
# the entrypoint, and torch judged by its own arch list. Small images: the kit base with Debian's python3 and a venv;
# torch is a module answering torch's two calls (`__version__`, `torch._C._cuda_getArchFlags()`) with the list a
# cu128 wheel records (test_vllm_offline.py does the same on the real toolchain with real torch 2.10.0).
PY_SITE = "/opt/venv/lib/python3.13/site-packages"
PY_MANIFEST = {"engine": "vllm", "recipe": "torch-source", "archs": [70], "prefix": "/opt/venv", "package": "vllm",
               "entrypoint": ["/opt/venv/bin/vllm", "serve"], "nccl_pin": None}
# pip's console script (distlib's template), run by the venv's own python
PY_SCRIPT = ("#!/opt/venv/bin/python3\nimport sys\nfrom vllm.entrypoints.cli.main import main\n"
             "if __name__ == '__main__':\n    sys.exit(main())\n")


def python_engine(client, base: str, name: str, so_files: dict[str, str], script: str = PY_SCRIPT,
                  torch_module: str | None = None, manifest: dict | None = None, make_venv: bool = False) -> str:
    """``kit/test-verify:<name>``: a Python engine on ``base``, its console script at /opt/venv/bin/vllm, the fatbin
    fixtures as extension modules (site-packages path -> fixture), and ``torch_module`` as torch (in a venv made here
    with ``make_venv``, for a base that has python3 but no venv)."""
    files = {"vllm": script.encode(), "manifest.json": json.dumps({**PY_MANIFEST, **(manifest or {})}).encode()}
    lines = [f"FROM {base}", "USER root", "RUN mkdir -p /opt/kit", "COPY manifest.json /opt/kit/manifest.json",
             "COPY vllm /opt/venv/bin/vllm", "RUN chmod 755 /opt/venv/bin/vllm"]
    for i, (where, fixture) in enumerate(sorted(so_files.items())):
        files[f"so{i}"] = (FATBIN / FIXTURE_FOR[fixture]).read_bytes()
        lines.append(f"COPY so{i} {PY_SITE}/{where}")
    if torch_module is not None:
        files["torch.py"] = torch_module.encode()
        lines += ["RUN python3 -m venv /opt/venv"] if make_venv else []
        lines.append(f"COPY torch.py {PY_SITE}/torch/__init__.py")
    lines += ["RUN useradd -u 10001 -m kit", "USER 10001", 'ENTRYPOINT ["/opt/venv/bin/vllm", "serve"]']
    return build_context(client, name, {"Dockerfile": "\n".join(lines).encode() + b"\n", **files})


def fake_torch(version: str, flags: str) -> str:
    return (f"__version__ = {version!r}\nclass _C:\n    @staticmethod\n    def _cuda_getArchFlags():\n"
            f"        return {flags!r}\n")


VOLTA_TORCH = fake_torch("2.8.0+cu128", "sm_70 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120")  # torch 2.8.0's cu128 list
PY_GOOD = {"so": {"vllm/_C.abi3.so": "sm70.so"}, "torch": VOLTA_TORCH}
PY_CASES = {  # name -> (changes to PY_GOOD, the check, "ok"/"fail", a phrase of the detail)
    "py-good": ({}, "cuda-arch", "ok", "1 files carry real code for sm [70] only, no PTX; torch 2.8.0+cu128 carries "
                                       "sm_70 (of sm_70 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120)"),
    "py-good-entrypoint": ({}, "entrypoint", "ok", 'exec form ["/opt/venv/bin/vllm", "serve"]'),
    "py-no-torch": ({"torch": None}, "cuda-arch", "ok", "1 files carry real code for sm [70] only, no PTX"),
    "py-torch-without-volta": ({"torch": fake_torch("2.11.0+cu128", "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120")},
                               "cuda-arch", "fail", "torch 2.11.0+cu128 was built for sm_75 sm_80 sm_86 sm_90 sm_100 "
                                                    "sm_120, not sm_70"),
    # a CPU-only torch has an empty arch list
    "py-torch-cpu-only": ({"torch": fake_torch("2.8.0+cpu", "")}, "cuda-arch", "fail",
                          "torch 2.8.0+cpu was built for no CUDA arch, not sm_70"),
    "py-torch-exits-silently": ({"torch": "import sys\nsys.exit(3)\n"}, "cuda-arch", "fail",
                                "cannot ask torch for its archs: no output"),
    "py-torch-broken": ({"torch": "raise ImportError('libcudart.so.12: cannot open shared object file')\n"},
                        "cuda-arch", "fail", "cannot ask torch for its archs: ImportError: libcudart.so.12"),
    "py-wrong-arch-in-a-subpackage": ({"so": {"vllm/_C.abi3.so": "sm70.so",
                                              "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": "sm80.so"}},
                                      "cuda-arch", "fail", f"{PY_SITE}/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so: sm [80]"),
    "py-ptx-beside": ({"so": {"vllm/_C.abi3.so": "sm70_ptx70.so"}}, "cuda-arch", "fail",
                      f"PTX beside the real code ({PY_SITE}/vllm/_C.abi3.so: compute [70])"),
    # sm_70 code in another package is not the engine's
    "py-no-device-code": ({"so": {"other/_C.abi3.so": "sm70.so"}}, "cuda-arch", "fail",
                          "no CUDA device code found; expected sm_[70]"),
    "py-shell-script": ({"script": "#!/bin/sh\nexec /opt/nvidia/nvidia_entrypoint.sh \"$@\"\n"}, "entrypoint", "fail",
                        "/opt/venv/bin/vllm is a script, not the engine binary"),
    # a script run by another interpreter than a python: not pip's console script
    "py-perl-shebang": ({"script": "#!/usr/bin/perl\nexec('/bin/sh');\n"}, "entrypoint", "fail", "is a script"),
    # the console script is allowed only to a recipe that pip installs
    "py-script-for-a-cmake-engine": ({"manifest": {"recipe": "cmake"}}, "entrypoint", "fail", "is a script"),
}


@pytest.fixture(scope="module")
def python_base(docker_ready, base_image):
    """The kit base with Debian's python3 and an empty venv at /opt/venv (the venv module, no pip)."""
    return build_context(docker_ready, "py-base", {"Dockerfile": (
        f"FROM {base_image}\nRUN apt-get update && apt-get install -y --no-install-recommends python3 "
        "&& rm -rf /var/lib/apt/lists/* && python3 -m venv --without-pip /opt/venv\n").encode()})


@pytest.mark.parametrize("case", sorted(PY_CASES))
def test_python_engine_checks(case, docker_ready, python_base):
    changes, check, status, phrase = PY_CASES[case]
    spec = {**PY_GOOD, "script": PY_SCRIPT, "manifest": {}, **changes}
    tag = python_engine(docker_ready, python_base, case, spec["so"], spec["script"], spec["torch"], spec["manifest"])
    (result,) = checked(docker_ready, tag, [check])
    assert result.status == status, (case, result.detail)
    assert result.detail == phrase if status == "ok" else phrase in result.detail, (case, result.detail)


# ---- libs and runs: the engine binary is an ELF that links what the image lacks, or prints nothing, or fails
LOADS_CASES = {  # name -> (how /app/llama-server is made, check, status, phrase)
    "libs-resolve": ("true", "libs", "ok", "1 ELF files resolve"),
    "libs-from-the-driver": ("needs-libcuda", "libs", "ok", "1 ELF files resolve; from the host driver: libcuda.so.1"),
    "libs-unresolved": ("needs-missing", "libs", "fail", "unresolved: libkitmissing.so.1 (needed by llama-server)"),
    "runs-prints": ("echo", "runs", "ok", "`/app/llama-server --version`: echo (GNU coreutils)"),
    # GNU true answers --version; a program that prints nothing at all does not
    "runs-silent": ("silent", "runs", "fail", "`/app/llama-server --version` exited 0: "),
    "runs-fails": ("false", "runs", "fail", "`/app/llama-server --version` exited 1"),
    "runs-needs-the-driver": ("needs-libcuda", "runs", "skip", "needs libcuda.so.1 from the NVIDIA driver to start"),
    "runs-unknown-engine": ("echo", "runs", "ok", "`/app/llama-server --version`: echo (GNU coreutils)"),
    # owner without x (mode 005): a `-perm -u+x` scan misses it, and the entrypoint is checked all the same
    "libs-entrypoint-hidden-from-the-scan": ("needs-missing", "libs", "fail",
                                             "unresolved: libkitmissing.so.1 (needed by llama-server)"),
}


@pytest.fixture(scope="module")
def linked_programs(tmp_path_factory):
    """Executables that need libcuda.so.1 (the host driver's) or libkitmissing.so.1 (nobody's), linked against stubs
    that the images do not get."""
    import shutil

    from tests.conftest import require

    gcc = shutil.which("gcc") or shutil.which("cc")
    require("GCC", gcc is not None, "no C compiler (apt-get install gcc)")
    root = tmp_path_factory.mktemp("linked")
    out = {}
    for name, soname, symbol in (("needs-libcuda", "libcuda.so.1", "cuInit"),
                                 ("needs-missing", "libkitmissing.so.1", "kit_missing")):
        (root / f"{name}.c").write_text(f"int {symbol}(unsigned f) {{ return (int) f; }}\n")
        subprocess.run([gcc, "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(root / soname),
                        str(root / f"{name}.c")], check=True)
        (root / f"{name}-main.c").write_text(f"int {symbol}(unsigned);\nint main(void) {{ return {symbol}(0); }}\n")
        subprocess.run([gcc, "-o", str(root / name), str(root / f"{name}-main.c"), f"-L{root}", f"-l:{soname}"],
                       check=True)
        out[name] = (root / name).read_bytes()
    (root / "silent.c").write_text("int main(void) { return 0; }\n")
    subprocess.run([gcc, "-o", str(root / "silent"), str(root / "silent.c")], check=True)
    out["silent"] = (root / "silent").read_bytes()
    return out


@pytest.mark.parametrize("case", sorted(LOADS_CASES))
def test_libs_and_runs(case, docker_ready, base_image, linked_programs):
    program, check, status, phrase = LOADS_CASES[case]
    forged = {"engine": "some-engine"} if case == "runs-unknown-engine" else None
    if program in linked_programs:
        mode = "005" if case == "libs-entrypoint-hidden-from-the-scan" else "755"
        tag = build(docker_ready, base_image, case, "USER root\nCOPY engine /app/llama-server\n"
                    f"RUN chmod {mode} /app/llama-server\nUSER 10001", forged, {"engine": linked_programs[program]})
    else:
        tag = build(docker_ready, base_image, case, f"USER root\nRUN cp /usr/bin/{program} /app/llama-server\n"
                    "USER 10001", forged)
    (result,) = checked(docker_ready, tag, [check])
    assert result.status == status and phrase in result.detail, (case, result.detail)
