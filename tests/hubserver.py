"""A stand-in Hugging Face hub on 127.0.0.1, written from the client's own source (huggingface_hub 2.4):

- the repo tree: ``HfApi._iter_repo_tree_pages`` GETs ``{endpoint}/api/models/{repo_id}/tree/{revision}`` with
  ``recursive`` / ``expand`` and reads a JSON list of ``{"type": "file", "oid", "size", "path", "lfs": {"oid",
  "size", "pointerSize"}}`` (``RepoFile.__init__``: ``lfs["oid"]`` is the sha256); pages follow the ``Link`` header;
- errors: ``utils/_http.py`` ``hf_raise_for_status`` reads ``X-Error-Code`` (``RevisionNotFound``, ``GatedRepo``,
  ``RepoNotFound``) and ``X-Error-Message``;
- the resolve URL: ``file_download.get_hf_file_metadata`` sends HEAD ``{endpoint}/{repo_id}/resolve/{revision}/
  {filename}`` and follows redirects only on the hub's own origin (``_httpx2_follow_hub_redirects_with_backoff``):
  an LFS file answers 302 to the storage host, and the metadata comes from that 302 itself: ``X-Repo-Commit``,
  ``X-Linked-Etag`` (else ``ETag``), ``X-Linked-Size``, ``Location``;
- the download: ``http_get`` GETs the ``Location`` (the storage host, here a second server on another port, so another
  origin), resuming with ``Range: bytes=N-`` and expecting 206 with ``Content-Range``.
The storage server counts the bytes it sends, per request.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

from werkzeug.wrappers import Request, Response

COMMIT = "d1c4e1c0ffee00000000000000000000000000aa"


@dataclass
class Repo:
    files: dict[str, Path]  # path in repo -> file on disk
    sha256: dict[str, str] = field(default_factory=dict)  # path -> published sha256 (computed when missing)
    gated: bool = False
    revisions: tuple[str, ...] = ("main", COMMIT)


class Storage:
    """The CDN: serves blobs by sha256 with byte ranges; ``hold_after`` stalls a response mid-way (a download to kill)."""

    def __init__(self) -> None:
        self.blobs: dict[str, Path] = {}
        self.sent: list[tuple[str, int, int]] = []  # (blob, range start, bytes sent)
        self.hold_after: int | None = None
        self.release = threading.Event()
        self.held = threading.Event()
        self.flip_byte: str | None = None  # a blob whose bytes arrive with one bit flipped

    def __call__(self, request: Request) -> Response:
        blob = request.path.rsplit("/", 1)[-1]
        path = self.blobs[blob]
        size = path.stat().st_size
        start, end = 0, size - 1
        ranged = re.match(r"bytes=(\d+)-(\d*)$", request.headers.get("Range", ""))
        if ranged:
            start = int(ranged[1])
            end = min(int(ranged[2]), size - 1) if ranged[2] else size - 1
        length = end - start + 1
        headers = {"Content-Length": str(length), "Accept-Ranges": "bytes", "ETag": f'"{blob}"'}
        if ranged:
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        if request.method == "HEAD":
            return Response(status=206 if ranged else 200, headers=headers)
        record = [blob, start, 0]
        self.sent.append(record)  # type: ignore[arg-type]

        def body():
            with open(path, "rb") as f:
                f.seek(start)
                left = length
                while left:
                    chunk = f.read(min(1 << 16, left))
                    if self.flip_byte == blob and start == 0 and record[2] == 0:
                        chunk = bytes([chunk[0] ^ 1]) + chunk[1:]
                    if self.hold_after is not None and record[2] + len(chunk) > self.hold_after:
                        chunk = chunk[: self.hold_after - record[2]]
                        record[2] += len(chunk)
                        yield chunk
                        self.held.set()
                        self.release.wait(30)
                        return  # the connection ends short of Content-Length
                    record[2] += len(chunk)
                    left -= len(chunk)
                    yield chunk

        return Response(body(), status=206 if ranged else 200, headers=headers, direct_passthrough=True)

    def bytes_sent(self) -> int:
        return sum(r[2] for r in self.sent)


def publish(storage: Storage, repo: Repo) -> Repo:
    """Put a repo's files into the storage host by their sha256 (hashed here unless the repo names it)."""
    for path, disk in repo.files.items():
        if path not in repo.sha256:
            digest = hashlib.sha256()
            with open(disk, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 22), b""):
                    digest.update(chunk)
            repo.sha256[path] = digest.hexdigest()
        storage.blobs[repo.sha256[path]] = disk
    return repo


class Hub:
    def __init__(self, storage: Storage, storage_url: str) -> None:
        self.repos: dict[str, Repo] = {}
        self.storage, self.storage_url = storage, storage_url.rstrip("/")
        self.requests: list[tuple[str, str]] = []

    def add(self, repo_id: str, repo: Repo) -> None:
        self.repos[repo_id] = publish(self.storage, repo)

    @staticmethod
    def error(status: int, code: str, message: str) -> Response:
        return Response(json.dumps({"error": message}), status=status, content_type="application/json",
                        headers={"X-Error-Code": code, "X-Error-Message": message})

    def find(self, repo_id: str, revision: str) -> Repo | Response:
        repo = self.repos.get(repo_id)
        if repo is None:
            return self.error(401, "RepoNotFound", "Repository not found")
        if repo.gated:
            return self.error(403, "GatedRepo", "Access to model is restricted, you must be authenticated")
        if revision not in repo.revisions:
            return self.error(404, "RevisionNotFound", "Invalid rev id: " + revision)
        return repo

    def __call__(self, request: Request) -> Response:
        self.requests.append((request.method, request.path))
        tree = re.match(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)$", request.path)
        if tree:
            repo = self.find(tree[1], tree[2])
            if isinstance(repo, Response):
                return repo
            entries = [{"type": "file", "oid": hashlib.sha1(path.encode()).hexdigest(), "size": disk.stat().st_size,
                        "path": path, "lfs": {"oid": repo.sha256[path], "size": disk.stat().st_size,
                                              "pointerSize": 134}}
                       for path, disk in sorted(repo.files.items())]
            return Response(json.dumps(entries), content_type="application/json")
        resolve = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", request.path)
        if resolve:
            repo = self.find(resolve[1], resolve[2])
            if isinstance(repo, Response):
                return repo
            path = resolve[3]
            if path not in repo.files:
                return self.error(404, "EntryNotFound", f"{path} does not exist on {resolve[2]}")
            sha = repo.sha256[path]
            return Response(status=302, headers={
                "Location": f"{self.storage_url}/blobs/{sha}", "X-Repo-Commit": COMMIT,
                "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(repo.files[path].stat().st_size),
                "ETag": f'"{hashlib.sha1(path.encode()).hexdigest()}"', "Content-Length": "0"})
        return Response("Not Found", status=404)


class ModelScope:
    """A stand-in ModelScope, from its client's code (modelscope_hub 0.5.1):

    - ``_legacy_api.LegacyClient._list_files_page``: GET ``{endpoint}/api/v1/models/{repo_id}/repo/files`` with
      ``Revision`` and ``Recursive`` ("True"); ``_json_data`` unwraps ``Data`` and then ``Files``: entries with
      ``Path``, ``Size``, ``Sha256``, ``Type`` ("blob" / "tree"), as ``api.HubApi.list_repo_files`` normalises them;
    - ``errors.raise_for_status``: 404 -> ``NotExistError``, 401 -> ``AuthenticationError``, 403 ->
      ``PermissionDeniedError`` (the body's ``Code`` / ``Message`` is the envelope);
    - ``LegacyClient.get_download_url``: ``{endpoint}/api/v1/models/{repo_id}/repo?Revision=&FilePath=``, the bytes
      themselves, read here with byte ranges (the client's parallel download sends ``Range`` too).
    Files are served from disk; ``storage`` counts what is sent, as for the Hugging Face stand-in.
    """

    def __init__(self, storage: Storage) -> None:
        self.repos: dict[str, Repo] = {}
        self.storage = storage
        self.requests: list[tuple[str, str]] = []

    def add(self, repo_id: str, repo: Repo) -> None:
        self.repos[repo_id] = publish(self.storage, repo)

    @staticmethod
    def error(status: int, message: str) -> Response:
        return Response(json.dumps({"Code": status, "Message": message, "Success": False}), status=status,
                        content_type="application/json")

    def __call__(self, request: Request) -> Response:
        self.requests.append((request.method, request.full_path))
        m = re.match(r"^/api/v1/models/([^/]+/[^/]+)/repo(/files)?$", request.path)
        if not m:
            return self.error(404, "Not Found")
        repo = self.repos.get(m[1])
        revision = request.args.get("Revision", "master")
        if repo is None:
            return self.error(404, f"model {m[1]} not found")
        if repo.gated:
            return self.error(403, "access denied")
        if revision not in repo.revisions:
            return self.error(404, f"revision {revision} not found")
        if m[2]:
            files = [{"Name": p.rsplit("/", 1)[-1], "Path": p, "Revision": COMMIT, "Size": d.stat().st_size,
                      "Sha256": repo.sha256[p], "Type": "blob", "IsLFS": True} for p, d in sorted(repo.files.items())]
            return Response(json.dumps({"Code": 200, "Data": {"Files": files}, "Success": True}),
                            content_type="application/json")
        path = request.args.get("FilePath", "")
        if path not in repo.files:
            return self.error(404, f"file {path} not found")
        # the bytes, as the storage host serves them (ranges, counted)
        forward = Request.from_values(path=f"/blobs/{repo.sha256[path]}", method=request.method,
                                      headers={"Range": request.headers.get("Range", "")} if request.headers.get("Range") else {})
        return self.storage(forward)
