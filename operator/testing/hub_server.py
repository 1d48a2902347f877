"""A STAND-IN for the Hugging Face hub, for tests: it is not the hub and shares no code with it.

The real hub cannot be reached from where kuberl's tests run, yet the initializer (`kuberl
initialize`) must be tested with huggingface_hub's real client, so this server speaks the part of the
hub's HTTP protocol that huggingface_hub 2.4.0 uses to download a model repository, as read from its
source (hf_api.py, file_download.py, _snapshot_download.py, utils/_http.py):

- `GET /api/models/{repo}[/revision/{rev}]` (HfApi.model_info, `?blobs=true` for files_metadata): JSON
  with `sha` (the commit the revision resolves to) and `siblings` (`rfilename`, and with blobs also
  `size`, `blobId` and `lfs` {`size`, `sha256`, `pointerSize`}).
- `GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=..` (HfApi.list_repo_tree, which
  snapshot_download calls to list a commit's files): a JSON list of {`type`, `oid`, `size`, `path`,
  `lfs` {`oid`, `size`, `pointerSize`}}; one page (the hub pages at 1000 entries, which no test nears).
- `HEAD` and `GET /{repo}/resolve/{rev}/{file}` (get_hf_file_metadata, http_get): a plain file answers
  200 with `X-Repo-Commit`, `ETag` (its git blob id) and `Content-Length`; an LFS file answers 302 with
  `X-Repo-Commit`, `X-Linked-Etag` (its sha256), `X-Linked-Size` and a `Location` on a second origin, the
  "storage" listener, standing in for the hub's CDN: the client stops at a redirect to another origin
  (_httpx2_follow_hub_redirects_with_backoff) and downloads from it without the Authorization header,
  as it does from the real CDN's signed URLs. `Range` requests (a resumed download) answer 206.
- Errors as the hub signals them, in `X-Error-Code` / `X-Error-Message` (hf_raise_for_status): an
  unknown repository 404 RepoNotFound, an unknown revision 404 RevisionNotFound, a missing file 404
  EntryNotFound (with `X-Repo-Commit`). With a `token`, a repository is private unless added as public:
  a request for a private one without `Authorization` gets 401 RepoNotFound (what the hub answers for a
  private repository); a request with another token, for any repository, 401 "Invalid credentials in
  Authorization header" (the message the client tells apart).

Not served: Xet storage (no `xetHash`, no `X-Xet-*` headers: the client downloads over plain HTTP),
gated repositories, datasets and spaces, uploads.

Which files are LFS: those with a suffix that the hub's default .gitattributes sends to LFS (weights
and archives) and any file of 10 MiB or more (the hub refuses larger plain git files).

Every request is recorded (method, path, status, and the repository and file it delivered), so a test
can count what a client fetched. Run it in a test's process (`with HubServer(...) as hub:`) or as a
process of its own: `python -m kuberl.operator.testing.hub_server --host H --port P --repo ID=FOLDER
[--token T] --log FILE` writes each record as a JSON line to FILE.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_SUFFIXES = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".gguf",
    ".h5",
    ".msgpack",
    ".onnx",
    ".npy",
    ".npz",
    ".pkl",
    ".pickle",
    ".tar",
    ".gz",
    ".zip",
    ".zst",
    ".tflite",
    ".ot",
    ".arrow",
    ".parquet",
)
LFS_MIN_SIZE = 10 * 1024 * 1024
DEFAULT_BRANCH = "main"
_CHUNK = 1024 * 1024
_INVALID_TOKEN_MESSAGE = "Invalid credentials in Authorization header"

Origin = Literal["hub", "storage"]


@dataclass(frozen=True)
class RepoFile:
    """One file of a commit, read from the folder it was added from."""

    path: str
    """Relative to the repository's root, '/'-separated."""
    local: Path
    size: int
    git_oid: str
    """The git blob id of what git stores: the content itself, or for an LFS file its pointer."""
    sha256: str | None = None
    """LFS files only: the content's sha256 (the hub's ETag of the content, and the cache's blob name)."""
    pointer_size: int | None = None

    @property
    def lfs(self) -> bool:
        return self.sha256 is not None


@dataclass(frozen=True)
class Commit:
    sha: str
    files: dict[str, RepoFile]


@dataclass(frozen=True)
class RequestRecord:
    """One request the stand-in answered."""

    method: str
    path: str
    """As the client sent it, query string included."""
    status: int
    origin: Origin
    """hub: the API and /resolve; storage: the CDN stand-in that serves LFS files."""
    repo: str | None = None
    file: str | None = None
    """Set when the response carried the file's content (a GET answered 200 or 206)."""
    time: float = 0.0


def _git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def _is_lfs(path: str, size: int) -> bool:
    return path.lower().endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE


def _read_file(local: Path, path: str) -> RepoFile:
    sha1_content, sha256 = hashlib.sha1(), hashlib.sha256()
    size = local.stat().st_size
    sha1_content.update(b"blob %d\0" % size)
    with local.open("rb") as f:
        while chunk := f.read(_CHUNK):
            sha1_content.update(chunk)
            sha256.update(chunk)
    if not _is_lfs(path, size):
        return RepoFile(path=path, local=local, size=size, git_oid=sha1_content.hexdigest())
    pointer = _lfs_pointer(sha256.hexdigest(), size)
    return RepoFile(path=path, local=local, size=size, git_oid=_git_blob_oid(pointer), sha256=sha256.hexdigest(), pointer_size=len(pointer))


def _commit_sha(files: dict[str, RepoFile]) -> str:
    """A stand-in commit id: a function of the paths and contents only, so equal folders give equal commits."""
    digest = hashlib.sha1()
    for path in sorted(files):
        digest.update(f"{path}\0{files[path].git_oid}\n".encode())
    return digest.hexdigest()


class _Listener(ThreadingHTTPServer):
    daemon_threads = True
    hub: "HubServer"
    origin: Origin

    def __init__(self, host: str, port: int, hub: "HubServer", origin: Origin):
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.hub, self.origin = hub, origin
        super().__init__((host, port), _Handler)


def _repo_of(path: str) -> str:
    """The repository a hub URL path names: /api/models/{repo}[/...] or /{repo}/resolve/..."""
    rest = path[len("/api/models/") :] if path.startswith("/api/models/") else path.lstrip("/").partition("/resolve/")[0]
    for marker in ("/tree/", "/revision/"):
        rest = rest.partition(marker)[0]
    return unquote(rest.rstrip("/"))


class HubServer:
    """The stand-in hub: model repositories from local folders, served over HTTP on `host`."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int | None = None,
        token: str | None = None,
        *,
        storage_port: int | None = None,
        log_file: Path | None = None,
    ):
        """port None: any free port (see `url`). storage_port: the LFS storage origin's (None: any free port);
        a pod that downloads through this server must reach both. token: the repositories not added as
        public are private to it. log_file: each request is also appended to it as a JSON line."""
        self.host, self.token, self.log_file = host, token, log_file
        self._hub = _Listener(host, port or 0, self, "hub")
        self._storage = _Listener(host, storage_port or 0, self, "storage")
        self._commits: dict[str, dict[str, Commit]] = {}
        self._refs: dict[str, dict[str, str]] = {}
        self._public: set[str] = set()
        self._lock = threading.Lock()
        self._records: list[RequestRecord] = []
        self._threads: list[threading.Thread] = []

    # --- content --------------------------------------------------------------------------------

    def add_repo(self, repo_id: str, folder: Path, public: bool = False) -> str:
        """Serve the files under `folder` as a commit of `repo_id` and point its main branch at it.

        `public`: anyone may read it, as a public model on the hub (matters only with a `token`).

        Returns the commit id (40 hex digits, a function of the files' paths and contents). Adding the same
        repository again adds a commit and moves main; the earlier commits stay reachable by their id. The
        files are read when requested: the folder must not change while it is served.
        """
        folder = Path(folder)
        files = {}
        for local in sorted(p for p in folder.rglob("*") if p.is_file()):
            path = local.relative_to(folder).as_posix()
            files[path] = _read_file(local, path)
        if not files:
            raise ValueError(f"{folder}: no files to serve")
        sha = _commit_sha(files)
        with self._lock:
            self._commits.setdefault(repo_id, {})[sha] = Commit(sha=sha, files=files)
            self._refs.setdefault(repo_id, {})[DEFAULT_BRANCH] = sha
            if public:
                self._public.add(repo_id)
        return sha

    def is_public(self, repo_id: str) -> bool:
        with self._lock:
            return repo_id in self._public

    def commit(self, repo_id: str, revision: str = DEFAULT_BRANCH) -> str | None:
        """The commit that `revision` of `repo_id` names, as the hub would resolve it (None: no such one)."""
        found = self._resolve(repo_id, revision) if self._has_repo(repo_id) else None
        return found.sha if found is not None else None

    def _resolve(self, repo_id: str, revision: str) -> Commit | None:
        with self._lock:
            commits = self._commits[repo_id]
            return commits.get(self._refs[repo_id].get(revision, revision))

    def _has_repo(self, repo_id: str) -> bool:
        with self._lock:
            return repo_id in self._commits

    # --- lifecycle ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The endpoint to give the client (HF_ENDPOINT)."""
        return self._url(self._hub)

    @property
    def storage_url(self) -> str:
        return self._url(self._storage)

    def _url(self, listener: _Listener) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{listener.server_address[1]}"

    def start(self) -> "HubServer":
        for listener in (self._hub, self._storage):
            thread = threading.Thread(
                target=listener.serve_forever, kwargs={"poll_interval": 0.1}, name=f"hub-stand-in-{listener.origin}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        for listener in (self._hub, self._storage):
            if self._threads:
                listener.shutdown()
            listener.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads.clear()

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the request log ------------------------------------------------------------------------

    def _record(self, record: RequestRecord) -> None:
        with self._lock:
            self._records.append(record)
            if self.log_file is not None:
                with self.log_file.open("a") as f:
                    f.write(json.dumps(asdict(record)) + "\n")

    @property
    def requests(self) -> list[RequestRecord]:
        """Every request answered so far, in order (a copy)."""
        with self._lock:
            return list(self._records)

    def clear_requests(self) -> None:
        with self._lock:
            self._records.clear()

    def file_fetches(self, repo_id: str) -> dict[str, int]:
        """How many times each file of `repo_id` was downloaded whole: GETs answered 200 with its content
        (from /resolve or from storage). HEADs, API calls, redirects and ranged (resumed) GETs do not count."""
        counts: dict[str, int] = {}
        for r in self.requests:
            if r.repo == repo_id and r.file is not None and r.method == "GET" and r.status == 200:
                counts[r.file] = counts.get(r.file, 0) + 1
        return counts


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client expects; every response has a Content-Length
    server: _Listener

    def log_message(self, format: str, *args: object) -> None:  # the request log is the record, not stderr
        pass

    def do_GET(self) -> None:
        self._handle(send_body=True)

    def do_HEAD(self) -> None:
        self._handle(send_body=False)

    def _handle(self, send_body: bool) -> None:
        self._repo: str | None = None
        self._file: str | None = None
        status = 500
        try:
            if self.server.origin == "storage":
                status = self._storage(send_body)
            else:
                status = self._hub(send_body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a bug of the stand-in: say so to the client instead of dropping the connection
            status = self._reply(500, {"Content-Type": "text/plain"}, f"hub stand-in: {exc!r}".encode(), send_body)
        finally:
            self.server.hub._record(
                RequestRecord(
                    method=self.command,
                    path=self.path,
                    status=status,
                    origin=self.server.origin,
                    repo=self._repo,
                    file=self._file if send_body and status in (200, 206) else None,
                    time=time.time(),
                )
            )

    # --- the hub origin -------------------------------------------------------------------------

    def _hub(self, send_body: bool) -> int:
        path = urlsplit(self.path).path
        refused = self._refuse_auth(_repo_of(path), send_body)
        if refused:
            return refused
        if path.startswith("/api/models/"):
            return self._api(path[len("/api/models/") :], send_body)
        if "/resolve/" in path:
            repo, _, tail = path.lstrip("/").partition("/resolve/")
            revision, _, file = tail.partition("/")
            return self._resolve_file(unquote(repo), unquote(revision), unquote(file), send_body)
        return self._json(404, {"error": "Not Found"}, send_body)

    def _refuse_auth(self, repo_id: str, send_body: bool) -> int | None:
        token = self.server.hub.token
        if token is None:
            return None
        given = self.headers.get("Authorization")
        if given is None:
            if self.server.hub.is_public(repo_id):
                return None
            return self._error(401, "RepoNotFound", "Repository not found", send_body)
        if given != f"Bearer {token}":
            return self._error(401, None, _INVALID_TOKEN_MESSAGE, send_body)
        return None

    def _api(self, rest: str, send_body: bool) -> int:
        sub = None
        if "/tree/" in rest:
            repo, _, tail = rest.partition("/tree/")
            revision, _, sub = tail.partition("/")
            kind = "tree"
        elif "/revision/" in rest:
            repo, _, revision = rest.partition("/revision/")
            kind = "info"
        else:
            repo, revision, kind = rest, DEFAULT_BRANCH, "info"
        repo, revision = unquote(repo), unquote(revision)
        self._repo = repo
        commit = self._commit(repo, revision, send_body)
        if not isinstance(commit, Commit):
            return commit
        query = parse_qs(urlsplit(self.path).query)
        if kind == "tree":
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            return self._json(200, _tree(commit, unquote(sub or ""), recursive), send_body)
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        return self._json(200, _model_info(repo, commit, blobs), send_body)

    def _commit(self, repo: str, revision: str, send_body: bool) -> Commit | int:
        hub = self.server.hub
        if not hub._has_repo(repo):
            return self._error(404, "RepoNotFound", "Repository not found", send_body)
        commit = hub._resolve(repo, revision)
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", send_body)
        return commit

    def _resolve_file(self, repo: str, revision: str, path: str, send_body: bool) -> int:
        self._repo = repo
        commit = self._commit(repo, revision, send_body)
        if not isinstance(commit, Commit):
            return commit
        entry = commit.files.get(path)
        if entry is None:
            return self._error(404, "EntryNotFound", "Entry not found", send_body, {"X-Repo-Commit": commit.sha})
        self._file = path
        if entry.lfs:
            # The hub redirects LFS content to its CDN; the size and the content's hash travel on the redirect.
            location = f"{self.server.hub.storage_url}/repos/{quote(repo)}/lfs/{entry.sha256}?filename={quote(path, safe='')}"
            return self._reply(
                302,
                {
                    "X-Repo-Commit": commit.sha,
                    "ETag": f'"{entry.git_oid}"',
                    "X-Linked-Etag": f'"{entry.sha256}"',
                    "X-Linked-Size": str(entry.size),
                    "Location": location,
                },
                b"",
                send_body,
            )
        return self._content(entry, {"X-Repo-Commit": commit.sha, "ETag": f'"{entry.git_oid}"'}, send_body)

    # --- the storage origin (the CDN's stand-in) -----------------------------------------------

    def _storage(self, send_body: bool) -> int:
        # /repos/{repo}/lfs/{sha256}?filename=...: no Authorization (a signed URL's stand-in)
        parts = urlsplit(self.path)
        repo, sep, sha256 = parts.path.removeprefix("/repos/").rpartition("/lfs/")
        repo = unquote(repo)
        self._repo = repo or None
        hub = self.server.hub
        with hub._lock:
            commits = list(hub._commits.get(repo, {}).values()) if sep else []
        wanted = parse_qs(parts.query).get("filename", [None])[0]
        matches = [f for c in commits for f in c.files.values() if f.sha256 == sha256]
        entry = next((f for f in matches if f.path == wanted), matches[0] if matches else None)
        if entry is None:
            return self._reply(404, {"Content-Type": "text/plain"}, b"NoSuchKey", send_body)
        self._file = entry.path
        return self._content(
            entry, {"ETag": f'"{entry.sha256}"', "Content-Disposition": f'attachment; filename="{Path(entry.path).name}"'}, send_body
        )

    # --- responses ------------------------------------------------------------------------------

    def _content(self, entry: RepoFile, headers: dict[str, str], send_body: bool) -> int:
        start, end = 0, entry.size - 1
        status = 200
        wanted = self.headers.get("Range")
        if wanted and wanted.startswith("bytes=") and "," not in wanted:
            first, _, last = wanted[len("bytes=") :].partition("-")
            if first.isdigit():
                start = int(first)
                end = min(int(last), entry.size - 1) if last.isdigit() else entry.size - 1
                if start >= entry.size or start > end:
                    return self._reply(416, {"Content-Range": f"bytes */{entry.size}"}, b"", send_body)
                status = 206
                headers = {**headers, "Content-Range": f"bytes {start}-{end}/{entry.size}"}
        length = end - start + 1 if entry.size else 0
        self.send_response(status)
        for name, value in {
            **headers,
            "Content-Type": "application/octet-stream",
            "Accept-Ranges": "bytes",
            "Content-Length": str(length),
        }.items():
            self.send_header(name, value)
        self.end_headers()
        if send_body and length:
            with entry.local.open("rb") as f:
                f.seek(start)
                _copy(f, self.wfile, length)
        return status

    def _error(self, status: int, code: str | None, message: str, send_body: bool, extra: dict[str, str] | None = None) -> int:
        headers = {"X-Error-Message": message, **(extra or {})}
        if code is not None:
            headers["X-Error-Code"] = code
        return self._json(status, {"error": message}, send_body, headers)

    def _json(self, status: int, body: object, send_body: bool, headers: dict[str, str] | None = None) -> int:
        return self._reply(
            status, {"Content-Type": "application/json; charset=utf-8", **(headers or {})}, json.dumps(body).encode(), send_body
        )

    def _reply(self, status: int, headers: dict[str, str], body: bytes, send_body: bool) -> int:
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        if send_body and body:
            self.wfile.write(body)
        return status


def _copy(src, dst, length: int) -> None:
    while length > 0:
        chunk = src.read(min(_CHUNK, length))
        if not chunk:
            break
        dst.write(chunk)
        length -= len(chunk)


def _lfs_json(entry: RepoFile, hash_key: str) -> dict[str, object]:
    return {hash_key: entry.sha256, "size": entry.size, "pointerSize": entry.pointer_size}


def _model_info(repo: str, commit: Commit, blobs: bool) -> dict[str, object]:
    siblings = []
    for entry in commit.files.values():
        sibling: dict[str, object] = {"rfilename": entry.path}
        if blobs:
            sibling.update(size=entry.size, blobId=entry.git_oid)
            if entry.lfs:
                sibling["lfs"] = _lfs_json(entry, "sha256")
        siblings.append(sibling)
    author = repo.split("/")[0] if "/" in repo else None
    return {
        "_id": commit.sha[:24],
        "id": repo,
        "modelId": repo,
        "author": author,
        "sha": commit.sha,
        "private": False,
        "gated": False,
        "disabled": False,
        "tags": [],
        "siblings": siblings,
        "lastModified": "2024-01-01T00:00:00.000Z",
        "createdAt": "2024-01-01T00:00:00.000Z",
    }


def _tree(commit: Commit, sub: str, recursive: bool) -> list[dict[str, object]]:
    prefix = f"{sub.strip('/')}/" if sub.strip("/") else ""
    folders: set[str] = set()
    files = []
    for entry in commit.files.values():
        if not entry.path.startswith(prefix):
            continue
        rest = entry.path[len(prefix) :]
        parents = rest.split("/")[:-1]
        for depth in range(1, len(parents) + 1):
            if recursive or depth == 1:
                folders.add(prefix + "/".join(parents[:depth]))
        if recursive or not parents:
            item: dict[str, object] = {"type": "file", "oid": entry.git_oid, "size": entry.size, "path": entry.path}
            if entry.lfs:
                item["lfs"] = _lfs_json(entry, "oid")
            files.append(item)
    dirs = [
        {"type": "directory", "oid": hashlib.sha1(f"{commit.sha}:{d}".encode()).hexdigest(), "size": 0, "path": d} for d in sorted(folders)
    ]
    return dirs + sorted(files, key=lambda item: str(item["path"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kuberl.operator.testing.hub_server", description="A stand-in for the Hugging Face hub (tests only)."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    parser.add_argument("--storage-port", type=int, default=0, help="the LFS storage origin's port (0: any)")
    parser.add_argument("--repo", action="append", default=[], metavar="ID=FOLDER", required=True)
    parser.add_argument("--token", help="make every repository private to this token")
    parser.add_argument("--log", type=Path, help="append every request to this file as a JSON line")
    args = parser.parse_args(argv)
    hub = HubServer(args.host, args.port, args.token, storage_port=args.storage_port, log_file=args.log)
    for spec in args.repo:
        repo_id, sep, folder = spec.partition("=")
        if not sep:
            parser.error(f"--repo {spec}: expected ID=FOLDER")
        print(f"{repo_id} {hub.add_repo(repo_id, Path(folder))}", flush=True)
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    with hub:
        # The last line is the endpoint: a parent process reads it to know the server is up.
        print(f"serving {hub.url} (storage {hub.storage_url})", flush=True)
        stopped.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
