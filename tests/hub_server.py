"""A loopback stand-in for the few Hugging Face Hub endpoints that huggingface_hub 2.x uses to create a repository,
commit files to it, read its info and download from it (test code only).

Repositories live in memory with one branch, main; every commit is a full snapshot of the files, addressed by a
40-hex commit id, and older commits stay readable by that id. Uploads
are answered as "regular" (inline base64 in the commit), so no LFS or Xet server is needed. Requests the mock does not
know are answered 404 and recorded in `unhandled`, so a test can see what a client asked for.
"""

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

MAX_BODY = 64 * 2**20  # bounded: larger requests are refused
USER = "hf-ext-tester"
FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*(?:\n|\Z)", re.DOTALL)
REPO = r"(?P<repo>[\w.-]+/[\w.-]+)"
ROUTES = {  # (method, path pattern) -> handler name
    ("POST", r"/api/repos/create"): "create_repo",
    ("POST", rf"/api/models/{REPO}/preupload/(?P<rev>[^/]+)"): "preupload",
    ("POST", rf"/api/models/{REPO}/commit/(?P<rev>[^/]+)"): "commit",
    ("POST", r"/api/validate-yaml"): "validate_yaml",
    ("GET", r"/api/whoami-v2"): "whoami",
    ("GET", rf"/api/models/{REPO}(?:/revision/(?P<rev>[^/]+))?"): "model_info",
    ("GET", rf"/api/models/{REPO}/tree/(?P<rev>[^/]+)(?:/(?P<path>.+))?"): "tree",
    ("GET", rf"/{REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)"): "resolve",
    ("HEAD", rf"/{REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)"): "resolve",
}


class HubError(Exception):
    def __init__(self, status, message, code=None, commit=None, **payload):
        super().__init__(message)
        self.status, self.code, self.commit, self.payload = status, code, commit, payload


@dataclass
class Repo:
    commits: dict = field(default_factory=dict)  # commit id -> {path: bytes}
    main: str | None = None  # commit id of the main branch
    private: bool = False  # as created; an existing repository keeps it

    def snapshot(self, revision):
        revision = unquote(revision)
        commit = self.main if revision == "main" else revision
        if commit not in self.commits:
            raise HubError(404, f"revision {revision} not found", "RevisionNotFound")
        return commit, self.commits[commit]


class MockHub(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)  # loopback only, a free port
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []
        self.unhandled: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self._thread = None

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self):
        self._thread = threading.Thread(target=self.serve_forever, name="mock-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5)

    def files(self, repo_id, revision="main"):
        """`{path: bytes}` of a repository's revision, as a test reads it back."""
        return self.repo(repo_id).snapshot(revision)[1]

    def repo(self, repo_id):
        if repo_id not in self.repos:
            raise HubError(404, f"repository {repo_id} not found", "RepoNotFound")
        return self.repos[repo_id]

    # ----- endpoints: each returns (status, JSON payload or bytes[, headers]) or raises HubError ---------------------

    def create_repo(self, body, **_):
        repo_id = f"{body['organization']}/{body['name']}" if body.get("organization") else f"{USER}/{body['name']}"
        if repo_id in self.repos:
            raise HubError(409, f"You already created this model repo: {repo_id}", url=f"{self.endpoint}/{repo_id}")
        # huggingface_hub sends `visibility` (1.x) or `private` (earlier)
        repo = self.repos[repo_id] = Repo(private=bool(body.get("private")) or body.get("visibility") == "private")
        repo.main = _commit_id(repo_id, "initial", {})
        repo.commits[repo.main] = {}
        return 200, {"url": f"{self.endpoint}/{repo_id}", "name": repo_id}

    def preupload(self, body, repo, rev, **_):
        self.repo(repo).snapshot(rev)
        return 200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                               for f in body["files"]]}

    def commit(self, body, repo, rev, **_):
        target = self.repo(repo)
        if unquote(rev) != "main":
            raise HubError(404, f"branch {unquote(rev)} not found (the mock has only main)", "RevisionNotFound")
        parent, files = target.snapshot(rev)
        files = dict(files)
        header = {}
        for line in body.splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            key, value = item["key"], item["value"]
            if key == "header":
                header = value
            elif key == "file":
                if value.get("encoding") != "base64":
                    raise HubError(400, f"unsupported encoding {value.get('encoding')!r}")
                files[value["path"]] = base64.b64decode(value["content"])
            elif key == "deletedFile":
                files.pop(value["path"], None)
            elif key == "deletedFolder":
                files = {p: c for p, c in files.items() if not p.startswith(value["path"].rstrip("/") + "/")}
            else:  # lfsFile & co: preupload said "regular", so a client sending these is misbehaving
                raise HubError(400, f"unsupported commit operation {key!r}")
        commit = _commit_id(repo, header.get("summary", ""), files, parent)
        target.commits[commit] = files
        target.main = commit
        return 200, {"commitUrl": f"{self.endpoint}/{repo}/commit/{commit}", "commitOid": commit,
                     "success": True}

    def validate_yaml(self, body, **_):
        """The README's front matter must be a YAML mapping (a README without one only gets a warning)."""
        front = FRONT_MATTER.match(body.get("content", ""))
        if front is None:
            return 200, {"errors": [], "warnings": [{"message": "empty or missing yaml metadata in repo card"}]}
        try:
            metadata = yaml.safe_load(front.group(1))
        except yaml.YAMLError as error:
            return 400, {"errors": [{"message": f"invalid YAML: {str(error).splitlines()[0]}"}]}
        if not isinstance(metadata, dict):
            return 400, {"errors": [{"message": "the metadata is not a mapping"}]}
        return 200, {"errors": [], "warnings": []}

    def whoami(self, **_):
        return 200, {"type": "user", "name": USER, "fullname": "hf-ext tester", "orgs": [],
                     "auth": {"type": "access_token", "accessToken": {"displayName": "mock", "role": "write"}}}

    def model_info(self, repo, rev=None, **_):
        commit, files = self.repo(repo).snapshot(rev or "main")
        return 200, {"id": repo, "modelId": repo, "sha": commit, "private": self.repos[repo].private, "tags": [],
                     "siblings": [{"rfilename": path} for path in sorted(files)]}

    def tree(self, repo, rev, query, path="", **_):
        """The files and folders under `path` (all levels with `recursive=true`), as `list_repo_tree` reads them."""
        commit, files = self.repo(repo).snapshot(rev)
        prefix = unquote(path).strip("/")
        prefix = f"{prefix}/" if prefix else ""
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        entries = {}
        for name, content in files.items():
            if not name.startswith(prefix):
                continue
            parts = name[len(prefix):].split("/")
            levels = len(parts) - 1 if recursive else min(len(parts) - 1, 1)  # folders on the way to the file
            for depth in range(1, levels + 1):
                folder = prefix + "/".join(parts[:depth])
                entries[folder] = {"type": "directory", "path": folder, "oid": _sha1(folder.encode())}
            if recursive or len(parts) == 1:
                entries[name] = {"type": "file", "path": name, "size": len(content), "oid": _sha1(content)}
        if prefix and not entries:
            raise HubError(404, f"{prefix} not found in {repo}@{commit}", "EntryNotFound", commit)
        return 200, [entries[name] for name in sorted(entries)]

    def resolve(self, repo, rev, path, **_):
        commit, files = self.repo(repo).snapshot(rev)
        path = unquote(path)
        if path not in files:
            raise HubError(404, f"{path} not found in {repo}@{commit}", "EntryNotFound", commit)
        return 200, files[path], {"X-Repo-Commit": commit, "ETag": f'"{_sha1(files[path])}"'}


def _sha1(data):
    return hashlib.sha1(data).hexdigest()


def _commit_id(repo_id, message, files, parent=""):
    digest = hashlib.sha1(f"{repo_id}\0{parent}\0{message}".encode())
    for path in sorted(files):
        digest.update(path.encode() + b"\0" + hashlib.sha1(files[path]).digest())
    return digest.hexdigest()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30  # a stuck client cannot hold a thread forever

    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_GET(self):
        self._dispatch()

    def do_HEAD(self):
        self._dispatch()

    def do_POST(self):
        self._dispatch()

    def _dispatch(self):
        hub: MockHub = self.server
        url = urlsplit(self.path)
        path = url.path
        hub.requests.append((self.command, path))
        route = next(((name, match) for (method, pattern), name in ROUTES.items()
                      if method == self.command and (match := re.fullmatch(pattern, path))), None)
        if route is None:
            hub.unhandled.append((self.command, path))
            return self._send(404, {"error": f"mock hub: no route for {self.command} {path}"})
        name, match = route
        try:
            body = self._body()
            if self.command == "POST" and name != "validate_yaml" and "authorization" not in \
                    {k.lower() for k in self.headers}:
                raise HubError(401, "Invalid credentials in Authorization header")
            with hub.lock:
                result = getattr(hub, name)(body=body, query=parse_qs(url.query),
                                            **{k: v for k, v in match.groupdict().items() if v})
        except HubError as error:
            headers = {"X-Error-Code": error.code} if error.code else {}
            if error.commit:
                headers["X-Repo-Commit"] = error.commit
            return self._send(error.status, {"error": str(error), **error.payload}, headers)
        self._send(*result)

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self.close_connection = True  # the unread body must not be taken for the next request
            raise HubError(413, f"request body over {MAX_BODY} bytes")
        raw = self.rfile.read(length) if length else b""
        if "ndjson" in (self.headers.get("Content-Type") or ""):
            return raw.decode("utf-8")
        return json.loads(raw) if raw else {}

    def _send(self, status, payload, headers=None):
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream" if isinstance(payload, bytes)
                         else "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
