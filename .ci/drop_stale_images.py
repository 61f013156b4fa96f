"""Remove the tagged images no build of this CI run tagged: drop_stale_images.py SINCE [--dry-run] [--only PREFIX].

A pin or recipe change must not leave its old images on the CI machine's disk for good.

An image is stale when Docker's ``Metadata.LastTagTime`` is before SINCE (RFC 3339, UTC; a build re-tags its image
even when every layer came from the cache) and no fresh image is built on it: ``docker rmi`` of a parent only takes
its tag away, and the next run would import a new base and build everything cold. Parents are read from each
image's ``Parent`` (the legacy builder records it). Untagged layers of what went are pruned after. ``--only`` limits
the removal to tags starting with PREFIX (the test of this script uses it to touch nothing but its own images).
"""

from __future__ import annotations

import argparse
from datetime import datetime

import docker


def when(text: str) -> datetime:
    # "2026-12-05T22:45:32.429301127Z": Python reads microseconds at most
    head, _, rest = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + ("." + rest[:6] if rest else "") + "+00:00")


def main(since: str, dry_run: bool = False, only: str = "") -> None:
    client = docker.from_env()
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
    if not dry_run and not only:
        client.images.prune(filters={"dangling": True})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("since", help="RFC 3339 UTC time the tiers started at")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--only", default="", help="remove only tags starting with this")
    args = parser.parse_args()
    main(args.since, args.dry_run, args.only)
