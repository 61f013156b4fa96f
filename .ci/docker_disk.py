"""CI's Docker disk, kept in bounds on a machine that keeps /var/lib/docker between runs.

    docker_disk.py prepare --need-gib N      before the tiers
    docker_disk.py drop-stale SINCE [--only PREFIX] [--dry-run]    after a green run

A pin or recipe change leaves its old images behind for good, and one run died of ``no space left on device`` in two
CUDA toolkit installs. ``prepare`` removes stopped containers, untagged images older than three days and the images
no run tagged in the last three days, then checks that the free space and the cached images together cover a cold
run's need (a cache that small builds most of the run anew): if not, the whole cache goes (a cold run), and with less
than the need still free it stops with one line. ``drop-stale`` removes the tagged images no build of this run
tagged.

An image is stale when Docker's ``Metadata.LastTagTime`` is before SINCE (RFC 3339, UTC; a build re-tags its image
even when every layer came from the cache) and no fresh image is built on it: ``docker rmi`` of a parent only takes
its tag away, and the next run would import a new base and build everything cold. Parents are read from each
image's ``Parent`` (the legacy builder records it). Untagged images go only after three days: the stages of a
multi-stage build that the final image does not descend from (llama.cpp's ``core`` and ``gpu-backend``, where the
compiles happen) are untagged leaves, and pruning them as "dangling" makes every run compile llama.cpp again (it
did, for one run: 20 minutes more). ``--only`` limits the removal to tags starting with PREFIX (the test of this
script touches nothing but its own images).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from datetime import datetime, timedelta, timezone

import docker

GIB = 2**30
DOCKER_ROOT = "/var/lib/docker"


def when(text: str) -> datetime:
    # "2026-12-05T22:45:32.429301127Z": Python reads microseconds at most
    head, _, rest = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + ("." + rest[:6] if rest else "") + "+00:00")


def free_gib() -> float:
    return shutil.disk_usage(DOCKER_ROOT).free / GIB


def drop_stale(client: docker.DockerClient, since: str, dry_run: bool = False, only: str = "") -> None:
    cutoff = when(since)
    images = {image.id: image.attrs for image in client.images.list(all=True)}

    def tagged_at(attrs: dict) -> str:
        return (attrs.get("Metadata") or {}).get("LastTagTime") or "0001"

    fresh = [i for i, a in images.items()
             if a.get("RepoTags") and not tagged_at(a).startswith("0001") and when(tagged_at(a)) >= cutoff]
    keep: set[str] = set()
    for image_id in fresh:  # every ancestor of a fresh image stays
        while image_id and image_id not in keep:
            keep.add(image_id)
            image_id = images.get(image_id, {}).get("Parent") or ""
    for image_id, attrs in images.items():
        if image_id in keep:
            continue
        for tag in [t for t in attrs.get("RepoTags") or [] if t.startswith(only)]:
            if not dry_run:
                client.images.remove(tag)
            print(f"[ci] {'would remove' if dry_run else 'removed'} stale image {tag} (last tagged {tagged_at(attrs)})")


def prepare(client: docker.DockerClient, need_gib: float) -> int:
    client.containers.prune()
    client.images.prune(filters={"dangling": True, "until": "72h"})  # never this week's build stages (the docstring)
    three_days_ago = (datetime.now(timezone.utc) - timedelta(days=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    drop_stale(client, three_days_ago)
    cached = (client.df().get("LayersSize") or 0) / GIB
    print(f"[ci] {free_gib():.0f} GiB free for Docker, {cached:.0f} GiB of images cached; a cold run needs "
          f"{need_gib:.0f} GiB")
    if free_gib() + cached < need_gib:
        print("[ci] free space and cache together fall short: removing every unused image (this run builds cold)")
        client.images.prune(filters={"dangling": False})
        print(f"[ci] {free_gib():.0f} GiB free")
        if free_gib() < need_gib:
            print(f"[ci] the disk holding {DOCKER_ROOT} has {free_gib():.0f} GiB free; a cold run needs "
                  f"{need_gib:.0f} GiB: free some space on it", file=sys.stderr)
            return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    before = sub.add_parser("prepare", help="before the tiers")
    before.add_argument("--need-gib", type=float, required=True, help="what a cold run takes on disk")
    after = sub.add_parser("drop-stale", help="after a green run")
    after.add_argument("since", help="RFC 3339 UTC time the tiers started at")
    after.add_argument("--dry-run", action="store_true")
    after.add_argument("--only", default="", help="remove only tags starting with this")
    args = parser.parse_args()
    client = docker.from_env()
    if args.command == "prepare":
        return prepare(client, args.need_gib)
    drop_stale(client, args.since, args.dry_run, args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
