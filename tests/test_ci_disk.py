"""CI's disk keeper (.ci/docker_disk.py drop-stale) against a real dockerd: after a run it removes what no tier tagged,
and never the base a fresh image is built on (``docker rmi`` of a parent only takes its tag away, and the next run
would import a new base and build cold). Scoped with ``--only`` to this test's own tags."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import datetime, timezone

import pytest

from tests.conftest import ROOT
from tests.test_verify_adversarial import build_context

pytestmark = [pytest.mark.docker]
PREFIX = "kit/test-verify:ci-disk-"


def test_images_no_run_tagged_go_and_the_base_of_a_fresh_one_stays(docker_ready, base_image):
    client = docker_ready

    def dockerfile(base: str, line: str) -> dict[str, bytes]:
        return {"Dockerfile": f"FROM {base}\n{line}\n".encode()}

    stale_leaf = build_context(client, "ci-disk-stale-leaf", dockerfile(base_image, "RUN echo a > /a"))
    parent = build_context(client, "ci-disk-parent", dockerfile(base_image, "RUN echo p > /p"))
    time.sleep(1.1)  # LastTagTime is compared to the second
    since = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    time.sleep(1.1)
    child = build_context(client, "ci-disk-fresh-child", dockerfile(parent, "RUN echo c > /c"))
    try:
        script = [sys.executable, str(ROOT / ".ci" / "docker_disk.py"), "drop-stale", since, "--only", PREFIX]
        dry = subprocess.run([*script, "--dry-run"], capture_output=True, text=True, check=True).stdout
        assert dry.count("would remove") == 1 and stale_leaf in dry
        assert client.images.get(stale_leaf)  # a dry run removes nothing
        subprocess.run(script, check=True, capture_output=True)
        tags = {t for image in client.images.list() for t in image.tags}
        assert stale_leaf not in tags
        assert {parent, child} <= tags
    finally:
        for tag in (child, parent, stale_leaf):
            try:
                client.images.remove(tag)
            except Exception:  # noqa: BLE001 - already gone
                pass
