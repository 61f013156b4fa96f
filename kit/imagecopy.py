"""Copy an image from this machine's Docker to another host's, with no registry: ``docker save | docker load``
through the two daemons' APIs, streamed (never a tarball on disk), with progress.

For teams without a registry account (the push trap in seed 004): ``kit deploy`` copies what a replica host lacks.
With ``build.push`` the hosts pull from the registry instead, and nothing is copied.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from kit.errors import CheckFailed, KitError

CHUNK = 4 << 20  # bytes per read from the source daemon
REPORT_EVERY = 64 << 20  # a progress line per this many bytes sent


def missing(tags: list[str], dest: Any) -> list[str]:
    """The tags ``dest`` does not have."""
    from docker.errors import ImageNotFound

    out = []
    for tag in tags:
        try:
            dest.images.get(tag)
        except ImageNotFound:
            out.append(tag)
    return out


def copy(tag: str, source: Any, dest: Any, host: str, echo: Callable[[str], None] = print) -> int:
    """Stream ``tag`` from ``source`` into ``dest``; returns the bytes sent. ``host`` names ``dest`` in messages."""
    from docker.errors import APIError, ImageNotFound

    try:
        image = source.images.get(tag)
    except ImageNotFound:
        raise KitError("images", f"{tag} is not built on this machine, so it cannot be copied to {host}",
                       "run `kit build` first (or set build.push and push it to your registry)") from None
    total = int(image.attrs.get("Size") or 0)
    start = time.monotonic()
    sent = [0]

    def counted(chunks: Iterator[bytes]) -> Iterator[bytes]:
        reported = 0
        for chunk in chunks:
            sent[0] += len(chunk)
            if sent[0] - reported >= REPORT_EVERY:
                reported = sent[0]
                echo(progress(tag, host, sent[0], total, time.monotonic() - start))
            yield chunk

    echo(f"copying {tag} to {host} ({total / 2**20:.0f} MiB unpacked, docker save | docker load)")
    try:
        dest.images.load(counted(image.save(chunk_size=CHUNK, named=True)))
    except APIError as exc:
        raise CheckFailed(f"loading {tag} on {host} failed: {exc.explanation or exc}") from None
    echo(progress(tag, host, sent[0], total, time.monotonic() - start, done=True))
    return sent[0]


def progress(tag: str, host: str, sent: int, total: int, seconds: float, done: bool = False) -> str:
    """One progress line: what was sent, how fast. ``total`` is the unpacked size, a rough bound of the archive."""
    rate = sent / 2**20 / seconds if seconds > 0 else 0.0
    head = "copied" if done else "copying"
    of = "" if done or not total else f" of ~{total / 2**20:.0f}"
    return f"{head} {tag} to {host}: {sent / 2**20:.0f}{of} MiB, {rate:.1f} MiB/s"
