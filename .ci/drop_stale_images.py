"""drop_stale_images.py SINCE [--dry-run]: remove the tagged images no build of this CI run tagged, so a pin or recipe change
does not leave its old images on the CI machine's disk for good.

An image is stale when Docker's ``Metadata.LastTagTime`` is before SINCE (RFC 3339, UTC; a build re-tags its image
even when every layer came from the cache) and no fresh image is built on it: ``docker rmi`` of a parent only takes
its tag away, and the next run would import a new base and build everything cold. Parents are read from each
image's ``Parent`` (the legacy builder records it). Untagged layers of what went are pruned after.
"""

from __future__ import annotations

import sys
from datetime import datetime

import docker


def when(text: str) -> datetime:
    # "2026-12-05T22:45:32.429301127Z": Python reads microseconds at most
    head, _, rest = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + ("." + rest[:6] if rest else "") + "+00:00")


def main(since: str, dry_run: bool = False) -> None:
    client = docker.from_env()
    cutoff = when(since)
    images = {image.id: image.attrs for image in client.images.list(all=True)}
    fresh = [i for i, a in images.items() if a.get("RepoTags") and a.get("Metadata", {}).get("LastTagTime")
             and not a["Metadata"]["LastTagTime"].startswith("0001") and when(a["Metadata"]["LastTagTime"]) >= cutoff]
    keep: set[str] = set()
    for image_id in fresh:  # every ancestor of a fresh image stays
        while image_id and image_id not in keep:
            keep.add(image_id)
            image_id = images.get(image_id, {}).get("Parent") or ""
    for image_id, attrs in images.items():
        if image_id in keep or not attrs.get("RepoTags"):
            continue
        for tag in attrs["RepoTags"]:
            if not dry_run:
                client.images.remove(tag)
            print(f"[ci] {'would remove' if dry_run else 'removed'} stale image {tag} (last tagged {attrs.get('Metadata', {}).get('LastTagTime')})")
    if not dry_run:
        client.images.prune(filters={"dangling": True})


if __name__ == "__main__":
    main(sys.argv[1], dry_run="--dry-run" in sys.argv[2:])
