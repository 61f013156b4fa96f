"""TLS material for a Docker daemon's tcp:// listener, made with the openssl CLI the way Docker's docs do
("Protect the Docker daemon socket"): a CA, a server certificate for 127.0.0.1, and a client certificate
(extendedKeyUsage clientAuth). The client's files are named as the docker CLI reads them from DOCKER_CERT_PATH:
ca.pem, cert.pem, key.pem."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _ssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make(folder: Path) -> tuple[Path, Path]:
    """(server folder: ca.pem server-cert.pem server-key.pem, client folder: ca.pem cert.pem key.pem)."""
    server, client = folder / "server", folder / "client"
    server.mkdir(parents=True)
    client.mkdir()
    _ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=kit-test-ca",
         "-keyout", "ca-key.pem", "-out", "ca.pem", cwd=folder)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
                      ("client", "extendedKeyUsage=clientAuth\n")):
        (folder / f"{name}.ext").write_text(ext)
        _ssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=kit-test-{name}", "-keyout", f"{name}-key.pem",
             "-out", f"{name}.csr", cwd=folder)
        _ssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem", "-CAcreateserial",
             "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}-cert.pem", cwd=folder)
    for src, dest in (("ca.pem", server / "ca.pem"), ("server-cert.pem", server / "server-cert.pem"),
                      ("server-key.pem", server / "server-key.pem"), ("ca.pem", client / "ca.pem"),
                      ("client-cert.pem", client / "cert.pem"), ("client-key.pem", client / "key.pem")):
        dest.write_bytes((folder / src).read_bytes())
    return server, client
