"""kit render's output folder: what collect() refuses, what it keeps from the last render, and how write_tree lays
the files down (beside the target, hidden, swapped in whole; modes; bytes). Written from kit.render's mutation
survivors (benchmarks/mutation.py)."""

from __future__ import annotations

import stat

import pytest

from kit import render
from kit.errors import KitError
from tests.conftest import make_config


def test_an_unknown_target_names_the_option_and_the_targets():
    with pytest.raises(KitError) as err:
        render.collect(make_config({}), None, "helm")
    assert err.value.line() == "--target: unknown target 'helm'; use one of compose, k8s"


def test_hosts_with_the_k8s_target_is_one_line():
    config = make_config({"hosts": [{"name": "here"}, {"name": "box2", "docker": "ssh://kit@10.0.0.2"}]})
    with pytest.raises(KitError) as err:
        render.collect(config, None, "k8s")
    assert err.value.line() == ("hosts: hosts: is for compose stacks; a cluster places pods on its own nodes; "
                                "drop hosts: for --target k8s (more replicas: scale the Deployment)")


def test_a_ca_bundle_that_is_not_a_file(tmp_path):
    missing = tmp_path / "corp.pem"
    with pytest.raises(KitError) as err:
        render.collect(make_config({"mirrors": {"ca_bundle": str(missing)}}))
    assert err.value.line() == f"mirrors.ca_bundle: {missing} is not a file; point it at a PEM bundle on this host"


def test_a_ca_bundle_goes_into_every_image_folder_byte_for_byte(tmp_path):
    ca = tmp_path / "corp.pem"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nMIIB\xc3\xa9\n-----END CERTIFICATE-----\n")
    out = tmp_path / "out"
    render.render_stack(make_config({"preset": "ninfer-primary", "mirrors": {"ca_bundle": str(ca)}}), out)
    for folder in ("llama.cpp", "ninfer", "front-door"):
        assert (out / "images" / folder / "kit" / "ca.crt").read_bytes() == ca.read_bytes()


def test_the_api_key_of_the_last_render_is_kept(tmp_path):
    out = tmp_path / "out"
    (out).mkdir()
    (out / ".env").write_text("KIT_API_KEY=kit-the-one-clients-have\n")
    files = render.collect(make_config({}), out)
    assert "\nKIT_API_KEY=kit-the-one-clients-have\n" in files[".env"]


def test_the_tree_is_written_beside_the_target_hidden_then_swapped_in(tmp_path, monkeypatch):
    target = tmp_path / "deep" / "er" / "out"  # its parents do not exist yet
    seen: list[list[str]] = []
    real = render.shutil.copyfile

    def copy_and_look(src, dst):
        seen.append(sorted(p.name for p in target.parent.iterdir()))  # mid-write: the temp folder, nothing else
        return real(src, dst)

    monkeypatch.setattr(render.shutil, "copyfile", copy_and_look)
    host_file = tmp_path / "blob"
    host_file.write_bytes(bytes(range(256)))
    render.write_tree(target, {"a.sh": "#!/bin/sh\n", "b.txt": "千问\n", "c.bin": b"\x00\x01", "d/copied": host_file,
                               ".env": "KIT_API_KEY=x\n", "e/api-key.env": "KIT_API_KEY=x\n"})
    assert len(seen) == 1 and len(seen[0]) == 1 and seen[0][0].startswith(".out.")
    assert sorted(p.name for p in target.parent.iterdir()) == ["out"]
    assert (target / "d" / "copied").read_bytes() == bytes(range(256))
    assert (target / "b.txt").read_bytes() == "千问\n".encode("utf-8")
    assert (target / "c.bin").read_bytes() == b"\x00\x01"
    mode = {rel: stat.S_IMODE((target / rel).stat().st_mode) for rel in ("a.sh", ".env", "e/api-key.env")}
    assert mode == {"a.sh": 0o755, ".env": 0o600, "e/api-key.env": 0o600}


def test_a_second_write_replaces_the_whole_tree(tmp_path):
    target = tmp_path / "out"
    render.write_tree(target, {"old.txt": "old\n"})
    render.write_tree(target, {"new.txt": "new\n"})
    assert sorted(p.name for p in target.iterdir()) == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the previous tree is gone, not set aside
