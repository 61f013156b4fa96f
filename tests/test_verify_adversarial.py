"""`kit verify` against images built to fool it: each carries exactly one defect and must fail that check, for
that reason. The control image (same recipe, no defect) passes the same checks. Needs Docker (CI: required).

The images are made from the kit base (`kit base`, no Docker Hub) in seconds: a fake engine is a copy of an ELF
binary from the base (`/usr/bin/true`), so no compiler is needed.
"""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from kit import verify

pytestmark = [pytest.mark.docker]

GOOD = """
FROM {base}
RUN cp /usr/bin/true /app-engine && mkdir -p /app /opt/kit && mv /app-engine /app/llama-server \\
 && useradd -u 10001 -m kit && cp /etc/ssl/certs/ca-certificates.crt /opt/kit/cacert.pem
COPY manifest.json /opt/kit/manifest.json
USER 10001
HEALTHCHECK CMD ["/app/llama-server"]
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
}


def build(client, base: str, name: str, extra: str = "", forged: dict | None = None) -> str:
    dockerfile = GOOD.format(base=base) + extra + "\n"
    manifest = {**MANIFEST, **(forged or {})}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for fname, data in (("Dockerfile", dockerfile.encode()), ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(fname)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    tag = f"kit/test-verify:{name}"
    client.images.build(fileobj=buffer, custom_context=True, tag=tag, rm=True)
    return tag


CHECKED = sorted({defect[1] for defect in DEFECTS.values()})


def test_control_image_passes(docker_ready, base_image):
    tag = build(docker_ready, base_image, "good")
    results = {r.name: r for r in verify.verify(tag, CHECKED)}
    for name in CHECKED:
        assert results[name].status == "ok", (name, results[name].detail)


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_one_defect_fails_its_check(defect, docker_ready, base_image):
    extra, check, reason, *forged = DEFECTS[defect]
    tag = build(docker_ready, base_image, defect, extra, *forged)
    (result,) = verify.verify(tag, [check])
    assert result.status == "fail", (defect, result.detail)
    assert reason in result.detail, (defect, result.detail)
