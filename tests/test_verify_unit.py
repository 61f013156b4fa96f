"""`kit verify`'s own machinery without Docker: the check loop, its errors and skips, and the NCCL helpers' failure
lines, against stand-in inspections whose commands answer what each test says."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from kit import verify
from kit.errors import KitError
from tests.conftest import make_config


class Answers:
    """A testinfra-like host: each command gets the (rc, stdout, stderr) of the first pattern it contains."""

    def __init__(self, answers: dict[str, tuple[int, str, str]]) -> None:
        self.answers, self.asked = answers, []

    def run(self, command: str):
        self.asked.append(command)
        rc, out, err = next((v for k, v in self.answers.items() if k in command), (1, "", ""))
        return SimpleNamespace(rc=rc, stdout=out, stderr=err)


class Fake:
    """An Inspection stand-in: no image, a host that answers, closed when verify() is done."""

    made: list["Fake"] = []

    def __init__(self, image: str) -> None:
        self.name, self.manifest, self.closed, self.stack = image, None, False, "unset"
        self.host = Answers({})
        Fake.made.append(self)

    def close(self) -> None:
        self.closed = True


def test_the_check_loop_reports_ok_skip_and_error_in_order_and_closes(monkeypatch):
    def skips(ins):
        raise verify._Skip("why it was skipped")

    def breaks(ins):
        raise ValueError("x" * 300)

    monkeypatch.setattr(verify, "CHECKS", [("a", skips), ("b", breaks), ("c", lambda ins: ("ok", "fine"))])
    stack = make_config({})
    results = verify.verify("some/image", None, stack=stack, inspection=Fake)
    assert results == [verify.Check("a", "skip", "why it was skipped"),
                       verify.Check("b", "error", "ValueError: " + "x" * 200),  # the message cut at 200
                       verify.Check("c", "ok", "fine")]
    assert Fake.made[-1].closed and Fake.made[-1].stack is stack and Fake.made[-1].name == "some/image"
    assert verify.verify("some/image", ["c"], inspection=Fake) == [verify.Check("c", "ok", "fine")]
    assert Fake.made[-1].stack is None


def test_an_unknown_check_is_one_line_before_any_image_is_opened(monkeypatch):
    monkeypatch.setattr(verify, "CHECKS", [("a", None), ("b", None)])
    made = len(Fake.made)
    with pytest.raises(KitError) as err:
        verify.verify("some/image", ["a", "nope", "other"], inspection=Fake)
    assert err.value.line() == "--check: unknown check 'nope'; use one of a, b"
    assert len(Fake.made) == made


def test_a_check_that_needs_the_manifest_skips_an_image_kit_did_not_build():
    with pytest.raises(verify._Skip) as skip:
        verify._need_manifest(Fake("x"))
    assert str(skip.value) == "no /opt/kit/manifest.json (not built by kit)"


def test_no_dynamic_loader_is_an_error_naming_it():
    ins = Fake("x")
    with pytest.raises(RuntimeError) as err:
        verify.nccl_resolved(ins, ["/app/llama-server"])
    assert str(err.value) == "no dynamic loader found in the image"
    assert ins.host.asked == ["test -x /lib64/ld-linux-x86-64.so.2", "test -x /lib/ld-linux-aarch64.so.1"]


def test_nccl_resolved_names_the_real_file_behind_the_loaders_path():
    ins = Fake("x")
    ins.host = Answers({"test -x /lib64": (0, "", ""),
                        "LD_TRACE_LOADED_OBJECTS=1 /lib64/ld-linux-x86-64.so.2 /app/a.so":
                            (0, "\tlibnccl.so.2 => /opt/n/libnccl.so.2 (0x7f)\n", ""),
                        "LD_TRACE_LOADED_OBJECTS=1 /lib64/ld-linux-x86-64.so.2 /app/b.so":
                            (0, "\tlibnccl.so.2 => /opt/m/libnccl.so.2 (0x7f)\n", ""),
                        "readlink -f /opt/n/libnccl.so.2": (0, "/opt/n/libnccl.so.2.27.3\n", ""),
                        "readlink -f /opt/m/libnccl.so.2": (1, "", "")})  # nothing to say: the loader's path stands
    assert verify.nccl_resolved(ins, ["/app/a.so", "/app/b.so", "/app/c.so"]) == {
        "/opt/n/libnccl.so.2.27.3": ["/app/a.so"], "/opt/m/libnccl.so.2": ["/app/b.so"]}


def test_a_probe_that_fails_says_why_in_its_last_200_characters(monkeypatch):
    monkeypatch.setattr(verify, "kit_probe", lambda: None)
    ins = Fake("x")
    ins.host = Answers({"python3 -c": (1, "", "Traceback ...\n" + "y" * 300 + "\nOSError: libnccl.so.2: cannot open\n")})
    with pytest.raises(RuntimeError) as err:
        verify.probe_nccl(ins, "/opt/n/libnccl.so.2")
    assert str(err.value) == ("y" * 300 + "\nOSError: libnccl.so.2: cannot open")[-200:]
    ins.host = Answers({"python3 -c": (1, "only stdout\n", "")})
    with pytest.raises(RuntimeError) as err:
        verify.probe_nccl(ins, "/opt/n/libnccl.so.2")
    assert str(err.value) == "only stdout"
    ins.host = Answers({"python3 -c": (1, "", "")})
    with pytest.raises(RuntimeError) as err:
        verify.probe_nccl(ins, "/opt/n/libnccl.so.2")
    assert str(err.value) == "/opt/n/libnccl.so.2 does not load"


@pytest.mark.parametrize("found", [("gcc",), ("cc",)])
def test_the_probe_is_compiled_by_gcc_else_cc(tmp_path, monkeypatch, found):
    """Whichever of gcc and cc this host has compiles the probe (a wrapper that records it ran, around the real one)."""
    real = shutil.which("gcc") or shutil.which("cc")
    if real is None:
        pytest.skip("no C compiler")
    wrapper = tmp_path / "bin" / found[0]
    wrapper.parent.mkdir()
    wrapper.write_text(f"#!/bin/sh\ntouch {tmp_path}/ran-{found[0]}\nexec {real} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setattr(shutil, "which", lambda name: str(wrapper) if name == found[0] else None)
    monkeypatch.setattr(Path, "home", lambda: tmp_path / "home")
    (tmp_path / "home" / ".cache" / "kit").mkdir(parents=True)  # the cache folder may exist already
    binary = verify.kit_probe()
    assert binary is not None and binary.is_file() and (tmp_path / f"ran-{found[0]}").exists()
    assert subprocess.run([str(binary)], capture_output=True).returncode in (0, 2)  # runs: 2 without a libnccl here
