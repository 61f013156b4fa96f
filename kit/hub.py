"""Models on a hub (Hugging Face, a mirror, or ModelScope): list a repo's files, read each GGUF header by HTTP
ranges, download with resume and a checksum. The hubs' own clients list and locate; kit fetches the bytes.

Hugging Face (or a mirror: ``mirrors.hf_endpoint`` / ``HF_ENDPOINT``) through ``huggingface_hub``: the repo tree
(``HfApi.list_repo_tree``, with each LFS file's sha256), the resolve URL (``hf_hub_url``) read by ``Range`` requests
for headers, and ``get_hf_file_metadata`` for where a file's bytes are; kit fetches them into a ``.part`` file it can
resume. Tokens are the client's business (``HF_TOKEN``, ``hf auth login``, sent by ``build_hf_headers``): kit never
writes or prints one.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from kit.errors import KitError
from kit.modelinfo import split_parts

SOURCE = re.compile(r"^(?P<kind>hf|modelscope):(?P<repo>[\w.-]+/[\w.-]+)(@(?P<rev>[\w./-]+))?$")
STAGING = ".kit-download"  # inside model.dir: the .part files; a file leaves it only once verified
BLOCK = 1 << 20  # bytes per range request while reading a header


@dataclass(frozen=True)
class Source:
    kind: str
    repo: str
    revision: str = "main"

    def __str__(self) -> str:
        return f"{self.kind}:{self.repo}" + (f"@{self.revision}" if self.revision != DEFAULT_REVISION[self.kind] else "")


DEFAULT_REVISION = {"hf": "main", "modelscope": "master"}  # each hub's default branch


def parse_source(text: str, field_name: str = "model.source") -> Source:
    match = SOURCE.match(text.strip())
    if not match:
        raise KitError(field_name, f"{text!r} is not a model source",
                       "write hf:ORG/REPO or modelscope:ORG/REPO, with @REVISION for a branch, tag or commit")
    return Source(match["kind"], match["repo"], match["rev"] or DEFAULT_REVISION[match["kind"]])


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None  # the LFS oid: what the hub publishes for the file's content


@dataclass
class RemoteModel:
    """A GGUF model in a repo: one file, or every part of a split one (part 1 first)."""

    parts: list[RemoteFile]
    missing: list[str] = field(default_factory=list)  # parts the name promises that the repo lacks

    @property
    def name(self) -> str:
        return self.parts[0].path

    @property
    def size(self) -> int:
        return sum(p.size for p in self.parts)


def gguf_models(files: list[RemoteFile]) -> list[RemoteModel]:
    """The repo's GGUF models, split parts grouped; vision projectors (mmproj-*) are not models of their own."""
    by_path = {f.path: f for f in files}
    models: list[RemoteModel] = []
    seen: set[str] = set()
    for f in sorted(files, key=lambda f: f.path):
        base = f.path.rsplit("/", 1)[-1]
        if not base.endswith(".gguf") or base.startswith("mmproj") or f.path in seen:
            continue
        folder = f.path[: len(f.path) - len(base)]
        names = [folder + name for name in split_parts(base)]
        seen.update(names)
        parts = [by_path[n] for n in names if n in by_path]
        models.append(RemoteModel(parts, [n for n in names if n not in by_path]))
    return models


def model_with_file(models: list[RemoteModel], file: str, source: Source) -> RemoteModel:
    """The model one of whose files (any part of a split GGUF) is ``file``."""
    model = next((m for m in models if file in [p.path for p in m.parts]), None)
    if model is None:
        raise KitError("--file", f"{source} has no {file}",
                       f"use one of {', '.join(m.name for m in models) or '(no .gguf files)'} "
                       "(kit model list plans them all)")
    return model


class RangeReader(io.RawIOBase):
    """A remote file as a seekable stream: each read fetches the blocks it needs with an HTTP Range request, so a
    header parser reads a 15 GB GGUF's first megabytes and nothing else. ``fetched`` counts the bytes received."""

    def __init__(self, url: str, size: int, headers: dict[str, str]) -> None:
        import requests

        self.url, self.size, self.headers = url, size, headers
        self.session = requests.Session()
        self.pos = 0
        self.blocks: dict[int, bytes] = {}
        self.fetched = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = {io.SEEK_SET: offset, io.SEEK_CUR: self.pos + offset, io.SEEK_END: self.size + offset}[whence]
        return self.pos

    def tell(self) -> int:
        return self.pos

    def _block(self, index: int) -> bytes:
        if index not in self.blocks:
            start = index * BLOCK
            end = min(start + BLOCK, self.size) - 1
            reply = self.session.get(self.url, headers={**self.headers, "Range": f"bytes={start}-{end}"},
                                     timeout=60)
            if reply.status_code != 206:  # a server that ignores Range would send the whole file
                raise KitError("model.source", f"{self.url} answered a range request with HTTP {reply.status_code}",
                               "use a hub or mirror that serves byte ranges (huggingface.co, hf-mirror.com)")
            self.blocks[index] = reply.content
            self.fetched += len(reply.content)
        return self.blocks[index]

    def read(self, size: int = -1) -> bytes:
        end = self.size if size < 0 else min(self.pos + size, self.size)
        out = bytearray()
        while self.pos < end:
            block = self._block(self.pos // BLOCK)
            offset = self.pos % BLOCK
            piece = block[offset: offset + end - self.pos]
            if not piece:
                break
            out += piece
            self.pos += len(piece)
        return bytes(out)


@contextmanager
def hub_errors(source: Source, endpoint: str) -> Iterator[None]:
    """The client's exceptions as one line each: what is wrong and what to do."""
    from huggingface_hub import errors

    where = f"{source} on {endpoint}"
    try:
        yield
    except errors.GatedRepoError:
        raise KitError("model.source", f"{where} is gated",
                       "accept its terms on the model page, then put a token in HF_TOKEN (never in kit.yaml)") from None
    except errors.RevisionNotFoundError:
        raise KitError("model.source", f"{where}: no revision {source.revision!r}",
                       "use a branch, tag or commit the repo has (default main)") from None
    except errors.RepositoryNotFoundError:
        raise KitError("model.source", f"{where}: no such repo, or it is private",
                       "check ORG/REPO; for a private repo put a token in HF_TOKEN (never in kit.yaml)") from None
    except errors.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise KitError("model.source", f"{where} answered HTTP {status}",
                       "retry later, or set mirrors.hf_endpoint to a mirror") from None
    except OSError as exc:  # the connection broke after reachable() said yes
        raise KitError("model.source", f"{where}: the connection failed ({exc.__class__.__name__})",
                       "run it again; kit model pull resumes where it stopped") from None


class HfHub:
    """One repo at one revision on the hub or a mirror."""

    SETTING = ("mirrors.hf_endpoint", "HF_ENDPOINT", "a mirror you can reach, e.g. https://hf-mirror.com")

    def __init__(self, source: Source, endpoint: str = "") -> None:
        from huggingface_hub import constants

        self.source = source
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")

    def files(self) -> list[RemoteFile]:
        from huggingface_hub import HfApi
        from huggingface_hub.hf_api import RepoFile

        reachable(self.endpoint, *self.SETTING)
        api = HfApi(endpoint=self.endpoint)
        with hub_errors(self.source, self.endpoint):
            tree = list(api.list_repo_tree(self.source.repo, revision=self.source.revision, recursive=True))
        return [RemoteFile(e.path, e.size, e.lfs.sha256 if e.lfs else None) for e in tree if isinstance(e, RepoFile)]

    def open(self, remote: RemoteFile) -> RangeReader:
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers

        url = hf_hub_url(self.source.repo, remote.path, revision=self.source.revision, endpoint=self.endpoint)
        return RangeReader(url, remote.size, build_hf_headers())

    def download(self, remote: RemoteFile, model_dir: Path,
                 progress: Callable[[int], None] | None = None) -> Path:
        """The hub's client finds where the bytes are (``get_hf_file_metadata``: the resolve URL's redirect, size
        and etag); ``fetch_verified`` fetches them. Since huggingface_hub PR #4228 the client's own downloader writes
        each process's bytes to a fresh temporary file, so a download killed mid-way would start over."""
        from huggingface_hub import get_hf_file_metadata, hf_hub_url
        from huggingface_hub.utils import build_hf_headers

        url = hf_hub_url(self.source.repo, remote.path, revision=self.source.revision, endpoint=self.endpoint)
        with hub_errors(self.source, self.endpoint):
            meta = get_hf_file_metadata(url, endpoint=self.endpoint)
        location = meta.location or url
        # the token goes to the hub only, never to the storage host it redirects to (as the client does it)
        headers = build_hf_headers() if _origin(location) == _origin(self.endpoint) else {}
        return fetch_verified(location, headers, remote, model_dir, progress)


def unreachable(endpoint: str, field_name: str, env: str, what: str, exc: BaseException) -> KitError:
    """The one line for an endpoint kit cannot reach: the setting that names another, and the way around."""
    return KitError(field_name, f"cannot reach {endpoint} ({exc.__class__.__name__})",
                    f"set {field_name} (or {env}) to {what}, or put the file into model.dir yourself")


def reachable(endpoint: str, field_name: str, env: str, what: str) -> None:
    """One quick connection first: the hubs' clients retry an unreachable endpoint for half a minute or more."""
    import requests

    try:
        requests.head(endpoint, timeout=10, allow_redirects=False)
    except requests.RequestException as exc:
        raise unreachable(endpoint, field_name, env, what, exc) from None


def fetch_verified(url: str, headers: dict[str, str], remote: RemoteFile, model_dir: Path,
                   progress: Callable[[int], None] | None = None) -> Path:
    """``remote`` into ``model_dir`` under its final name only once its sha256 matches the hub's; a killed download
    resumes from its ``.part`` file in ``model_dir/.kit-download``."""
    import requests

    staging = model_dir / STAGING
    staging.mkdir(parents=True, exist_ok=True)
    part = staging / (remote.path.replace("/", "__") + ".part")
    have = part.stat().st_size if part.is_file() else 0
    if have > remote.size:
        part.unlink()
        have = 0
    if have < remote.size:
        try:
            reply = requests.get(url, headers={**headers, "Range": f"bytes={have}-"}, stream=True, timeout=60)
            if reply.status_code == 200:  # the server ignored the range: start over
                have = 0
            elif reply.status_code != 206:
                raise KitError("model.source", f"{remote.path}: HTTP {reply.status_code} from {url}",
                               "run kit model pull again, or use a mirror")
            with open(part, "ab" if have else "wb") as f:
                for chunk in reply.iter_content(1 << 20):
                    f.write(chunk)
                    if progress:
                        progress(len(chunk))
        except requests.RequestException as exc:
            raise KitError("model.source", f"{remote.path}: the download broke ({exc.__class__.__name__}) at "
                           f"{part.stat().st_size if part.is_file() else 0} of {remote.size} bytes",
                           "run kit model pull again: it resumes from there") from None
    if part.stat().st_size != remote.size:
        raise KitError("model.source", f"{remote.path}: {part.stat().st_size} of {remote.size} bytes arrived",
                       "run kit model pull again: it resumes from there")
    if remote.sha256:
        digest = sha256_of(part)
        if digest != remote.sha256:
            part.unlink()
            raise KitError("model.source", f"{remote.path} arrived with sha256 {digest[:12]}…, but the hub "
                           f"publishes {remote.sha256[:12]}…; the download was deleted",
                           "run kit model pull again (a mirror that serves a different file is not one)")
    final = model_dir / remote.path
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(part, final)
    return final


def _origin(url: str) -> tuple[str, str, int | None]:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


class ModelScopeHub:
    """One repo at one revision on ModelScope, through its client (``modelscope_hub``, the optional extra
    ``kit[modelscope]``): the file list with each file's sha256 (``HubApi.list_repo_files``), and the legacy download
    URL ``{endpoint}/api/v1/models/{repo}/repo?Revision=&FilePath=`` (``LegacyClient.get_download_url``), read by
    byte ranges. The token is the client's: ``MODELSCOPE_API_TOKEN``, sent as ``Authorization: Bearer``."""

    SETTING = ("mirrors.modelscope_endpoint", "MODELSCOPE_ENDPOINT", "an endpoint you can reach")  # when unreachable

    def __init__(self, source: Source, endpoint: str = "") -> None:
        try:
            from modelscope_hub import HubApi
        except ImportError:
            raise KitError("model.source", "ModelScope needs its client",
                           "pip install 'kit[modelscope]' (the modelscope-hub package)") from None
        import logging

        logging.getLogger("modelscope_hub").setLevel(logging.ERROR)  # its retries would print over kit's one line
        self.source = source
        self.api = HubApi(endpoint=endpoint or os.environ.get("MODELSCOPE_ENDPOINT") or None)
        self.endpoint = self.api.legacy.endpoint

    def headers(self) -> dict[str, str]:
        token = os.environ.get("MODELSCOPE_API_TOKEN", "")
        return {"Authorization": f"Bearer {token}"} if token else {}

    @contextmanager
    def errors(self) -> Iterator[None]:
        from modelscope_hub import errors

        where = f"{self.source} on {self.endpoint}"
        try:
            yield
        except errors.NotExistError:
            raise KitError("model.source", f"{where}: no such repo or revision {self.source.revision!r}",
                           "check ORG/REPO and the revision (ModelScope's default is master)") from None
        except (errors.AuthenticationError, errors.PermissionDeniedError):
            raise KitError("model.source", f"{where} refused access (private or gated)",
                           "put a token in MODELSCOPE_API_TOKEN (never in kit.yaml)") from None
        except errors.NetworkError as exc:
            raise unreachable(self.endpoint, *self.SETTING, exc) from None
        except errors.APIError as exc:
            raise KitError("model.source", f"{where}: {exc}", "retry later") from None

    def files(self) -> list[RemoteFile]:
        reachable(self.endpoint, *self.SETTING)
        with self.errors():
            listed = self.api.list_repo_files(self.source.repo, "model", revision=self.source.revision)
        return [RemoteFile(f.path, f.size, f.sha256) for f in listed if f.type != "tree"]

    def url(self, remote: RemoteFile) -> str:
        return self.api.legacy.get_download_url(self.source.repo, "model", remote.path, self.source.revision)

    def open(self, remote: RemoteFile) -> RangeReader:
        return RangeReader(self.url(remote), remote.size, self.headers())

    def download(self, remote: RemoteFile, model_dir: Path,
                 progress: Callable[[int], None] | None = None) -> Path:
        return fetch_verified(self.url(remote), self.headers(), remote, model_dir, progress)


def connect(source: Source, hf_endpoint: str = "", modelscope_endpoint: str = "") -> HfHub | ModelScopeHub:
    """The hub a source names."""
    if source.kind == "modelscope":
        return ModelScopeHub(source, modelscope_endpoint)
    return HfHub(source, hf_endpoint)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_free_disk(model_dir: Path, needed: int) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(model_dir).free
    if free < needed:
        raise KitError("model.dir", f"{model_dir} has {free / 2**30:.1f} GiB free; the download needs "
                       f"{needed / 2**30:.1f} GiB", "free some space or point model.dir at a larger disk")


def pull(hub: HfHub | ModelScopeHub, model: RemoteModel, model_dir: Path, echo: Callable[[str], None],
         progress: Callable[[int], None] | None = None) -> Path:
    """Every part of ``model`` into ``model_dir``; parts already there with the right size are kept."""
    if model.missing:
        raise KitError("--file", f"{model.name} is split, but the repo lacks {', '.join(model.missing)}",
                       "pick another file (kit model list)")
    todo = [p for p in model.parts if not ((model_dir / p.path).is_file()
                                           and (model_dir / p.path).stat().st_size == p.size)]
    check_free_disk(model_dir, sum(p.size for p in todo))
    for part in todo:
        echo(f"downloading {part.path} ({part.size / 2**30:.2f} GiB) from {hub.source}")
        hub.download(part, model_dir, progress)
        echo(f"  sha256 checked: {part.path}")
    return model_dir / model.name
