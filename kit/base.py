"""``kit base``: a real Debian base image from Debian packages, for hosts (and CI) that cannot reach Docker Hub.

mmdebstrap writes a root filesystem tarball from the Debian archive (or your apt mirror); ``docker import`` turns it
into an image. Name it in kit.yaml as ``base.builder`` / ``base.runtime``.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from kit import dockerhost
from kit.errors import CheckFailed, KitError

DEFAULT_TAG = "kit/base:bookworm"
DEFAULT_PACKAGES = ["ca-certificates"]


def make_base(suite: str = "bookworm", tag: str = DEFAULT_TAG, mirror: str = "",
              packages: list[str] | None = None, variant: str = "minbase") -> str:
    """Build and import the image; returns its id."""
    exe = shutil.which("mmdebstrap")
    if exe is None:
        raise KitError("kit base", "mmdebstrap is not installed", "apt-get install mmdebstrap")
    if ":" not in tag:
        raise KitError("--tag", f"{tag!r} has no tag", "write it like kit/base:bookworm")
    include = ",".join(packages if packages is not None else DEFAULT_PACKAGES)
    with tempfile.TemporaryDirectory(prefix="kit-base-") as tmp:
        tarball = Path(tmp) / "rootfs.tar"
        cmd = [exe, f"--variant={variant}", suite, str(tarball)]
        if include:
            cmd.insert(1, f"--include={include}")
        if mirror:
            cmd.append(mirror)
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            tail = "\n".join(result.stderr.strip().splitlines()[-5:])
            raise CheckFailed(f"mmdebstrap failed:\n{tail}")
        repository, _, version = tag.rpartition(":")
        api = dockerhost.client().api
        api.import_image_from_file(str(tarball), repository=repository, tag=version,
                                   changes=["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                            'CMD ["/bin/bash"]'])
    return dockerhost.client().images.get(tag).id
