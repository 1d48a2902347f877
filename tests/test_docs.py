"""The documentation site: its generated pages are current, it builds with --strict, and it renders in a browser.

The browser is Debian's chromium (scripts/node-deps.sh installs it; `make test` runs that script), driven
headless through the DevTools protocol with websocket-client (a dependency of the kubernetes client):
the site is served over http://127.0.0.1 by a thread of this process, as a reader's browser would get it.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from kuberl.operator.codegen import docgen

# The pages the README links to by path: renaming one breaks those links.
PAGES = (
    "index.md",
    "install.md",
    "tutorials/main-job.md",
    "tutorials/first-cluster-job.md",
    "tutorials/new-algorithm.md",
    "tutorials/ppo-with-critic.md",
    "reference/rljob.md",
    "reference/algorithms.md",
    "reference/metrics.md",
    "operator.md",
    "cli.md",
    "monitoring.md",
    "architecture.md",
    "benchmarks.md",
    "testing.md",
)
CHROMIUM_INSTALL = "apt-get install -y --no-install-recommends chromium (or: bash scripts/node-deps.sh, as root)"


def test_the_readme_s_pages_exist(repo: Path) -> None:
    missing = [p for p in PAGES if not (repo / "docs" / p).is_file()]
    assert not missing, f"docs/ lacks {missing}"


def test_generated_pages_are_current(repo: Path) -> None:
    stale = docgen.stale(repo / "docs")
    assert not stale, f"generated pages are stale: {stale}; run `{docgen.COMMAND}` (or `make docs`)"


def test_generated_pages_say_they_are_generated(repo: Path) -> None:
    for name, content in docgen.generate(repo).items():
        if isinstance(content, str):
            assert content.startswith("<!-- Generated from ") and docgen.COMMAND in content.splitlines()[0], name


def test_the_rljob_reference_has_every_field_and_rule(repo: Path) -> None:
    """Every field of the CRD's spec has a row with its own anchor, and every rule of the models is on the page."""
    from kuberl.operator.api.crd import rljob_crd

    text = (repo / "docs" / "reference" / "rljob.md").read_text()
    schema = rljob_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]

    def paths(node: dict, path: str):
        for name, sub in node.get("properties", {}).items():
            yield f"{path}.{name}"
            inner = sub.get("items", sub) if sub.get("type") == "array" else sub
            if "volumeMounts" not in name and name not in ("volumes", "affinity", "env", "envFrom"):
                yield from paths(inner, f"{path}.{name}")

    missing = [p for p in paths(schema, "spec") if f'<span id="{p}"></span>' not in text]
    assert not missing, missing[:20]
    assert '<span id="spec.trainer.checkpoint.claimName"></span>' in text
    from kuberl.operator.api.spec import RLJobSpec

    for rule in RLJobSpec.RULES:
        assert docgen.cell(rule.message) in text, rule.message


def test_pages_have_no_development_history(repo: Path) -> None:
    """Dates, commit hashes and session talk belong to the project's history, not to its manual: neither the
    hand-written pages, nor the generated ones (the benchmark table leaves its files' dates in the files),
    nor the README."""
    patterns = {
        "a date": r"\b20\d\d-\d\d-\d\d\b",
        "a commit hash": r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b",
        "development talk": r"(?i)\bthis tree\b|\bsession\b|\bissue #?\d+|\bDESIGN\.md\b",
    }
    found = []
    for page in [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]:
        name = page.relative_to(repo).as_posix()
        for what, pattern in patterns.items():
            found += [f"{name}: {what}: {m.group(0)!r}" for m in re.finditer(pattern, page.read_text())]
    assert not found, found


def test_fields_named_in_the_pages_exist(repo: Path) -> None:
    """A field the hand-written pages name in code (`trainer.checkpoint.claimName`, `spec.cache`) is a row of the
    generated RLJob reference: a page cannot go on describing a field the API no longer has."""
    rows = set(re.findall(r'<span id="([^"]+)"></span>', (repo / "docs" / "reference" / "rljob.md").read_text()))
    sections = "model|tokenizer|data|algorithm|rollout|reward|roles|trainer|runPolicy|monitoring|cache|initializer|volumes"
    named = re.compile(rf"`((?:spec\.|status\.)?(?:{sections})\.[A-Za-z0-9_.\[\]]+)`")
    generated = set(docgen.generate(repo))
    unknown = []
    for page in sorted((repo / "docs").rglob("*.md")):
        name = page.relative_to(repo / "docs").as_posix()
        for match in named.finditer(page.read_text()) if name not in generated else ():
            path = match.group(1)
            if re.search(r"\.[A-Z]\.", path):  # a placeholder: spec.roles.R.env
                continue
            full = (path if path.startswith(("spec.", "status.")) else f"spec.{path}").replace("[]", "").rstrip(".")
            if full not in rows:
                unknown.append(f"{name}: {path}")
    assert not unknown, f"pages name fields the RLJob does not have: {unknown}"


def test_whole_rljobs_in_the_pages_are_valid(repo: Path, tmp_path: Path) -> None:
    """A YAML block of the docs that is a whole RLJob passes `kuberl validate`, cluster rules included."""
    from kuberl.operator.validation.cluster_rules import cluster_problems
    from kuberl.operator.validation.manifest import load_rljob_documents

    blocks = []
    for page in sorted((repo / "docs").rglob("*.md")):
        for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", page.read_text(), flags=re.S)):
            if "kind: RLJob" in block:
                path = tmp_path / f"{page.stem}-{i}.yaml"
                path.write_text(block)
                blocks.append(path)
    assert blocks, "no whole RLJob in the docs"
    for path in blocks:
        problems = [p for source, job in load_rljob_documents(path) for p in cluster_problems(job, source)]
        assert not problems, problems


def _mkdocs_build(repo: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(repo / "mkdocs.yml"), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=repo,
    )


@pytest.fixture(scope="module")
def site(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    started = time.monotonic()
    result = _mkdocs_build(repo, out)
    if result.returncode != 0:
        pytest.fail(f"mkdocs build --strict failed ({result.returncode}):\n{result.stderr[-4000:]}", pytrace=False)
    print(f"mkdocs build --strict: {time.monotonic() - started:.1f} s")
    return out


def test_site_builds_strict(site: Path) -> None:
    for page in PAGES:
        assert (site / page.replace(".md", ".html")).is_file(), page


# --- the browser ---------------------------------------------------------------------------------------------


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base class's name)
        pass


@pytest.fixture(scope="module")
def served(site: Path):
    """The built site over http://127.0.0.1, from a thread of this process."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class DevTools:
    """A page of a headless Chromium, through the DevTools protocol: navigate, evaluate, and collect what the
    console reports (errors logged by scripts, uncaught exceptions, failed loads)."""

    def __init__(self, url: str):
        import websocket  # websocket-client: the kubernetes client's dependency

        self.ws = websocket.create_connection(url, timeout=30, suppress_origin=True)
        self.next_id = 0
        self.errors: list[str] = []
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")

    def _event(self, message: dict) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.errors.append("uncaught: " + details.get("exception", {}).get("description", details.get("text", "")))
        elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            self.errors.append("console.error: " + " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"]))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.errors.append(f"log: {params['entry']['text']} {params['entry'].get('url', '')}")

    def _receive(self) -> dict:
        message = json.loads(self.ws.recv())
        if "method" in message:
            self._event(message)
        return message

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = self._receive()
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def open(self, url: str, settle_s: float = 1.5) -> None:
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + 30
        while self._receive().get("method") != "Page.loadEventFired":
            assert time.monotonic() < deadline, f"{url} did not load in 30 s"
        # Scripts run on load (the theme's bundle, the search worker): give them time to report.
        self.ws.settimeout(0.2)
        end = time.monotonic() + settle_s
        while time.monotonic() < end:
            try:
                self._receive()
            except Exception:  # a quiet interval: websocket's timeout
                pass
        self.ws.settimeout(30)

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail(f"the docs' browser test needs Debian's chromium, which is not installed: {CHROMIUM_INSTALL}", pytrace=False)
    profile = tmp_path_factory.mktemp("chromium-profile")
    log = profile.parent / "chromium.log"  # a file, not a pipe: a pipe nobody reads would stall the browser when full
    stderr = log.open("w")
    process = subprocess.Popen(
        [
            chromium,
            "--headless=new",
            "--disable-gpu",
            "--no-sandbox",
            "--no-first-run",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-dev-shm-usage",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "--remote-allow-origins=*",
            f"--user-data-dir={profile}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.is_file() and port_file.read_text().strip()):
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"chromium did not start its DevTools endpoint:\n{log.read_text()[-3000:]}", pytrace=False)
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
            page = next(t for t in json.load(response) if t["type"] == "page")
        devtools = DevTools(page["webSocketDebuggerUrl"])
        yield devtools
        devtools.ws.close()
    finally:
        process.kill()
        process.wait(timeout=30)
        stderr.close()


def test_index_renders_in_chromium(served: str, browser: DevTools) -> None:
    browser.errors.clear()
    browser.open(f"{served}/index.html")
    page = browser.evaluate(
        "({title: document.title, h1: document.querySelector('article h1')?.textContent,"
        " nav: document.querySelectorAll('nav.md-nav a').length,"
        " reference: !!document.querySelector('a[href$=\"reference/rljob.html\"]')})"
    )
    assert page["title"] == "kuberl", page
    assert page["h1"] and page["nav"] > 10 and page["reference"], page
    assert not browser.errors, browser.errors


def test_rljob_reference_renders_in_chromium(served: str, browser: DevTools) -> None:
    browser.errors.clear()
    browser.open(f"{served}/reference/rljob.html#spec.trainer.checkpoint.claimName")
    page = browser.evaluate(
        "(() => { const cell = document.getElementById('spec.trainer.checkpoint.claimName');"
        " const row = cell && cell.closest('tr');"
        " return {title: document.title, h1: document.querySelector('article h1')?.textContent, row: row && row.textContent,"
        " rows: document.querySelectorAll('article tr').length, sections: document.querySelectorAll('article h2').length}; })()"
    )
    assert page["title"] == "RLJob - kuberl" and page["h1"].startswith("RLJob reference"), page
    assert page["row"] and "spec.trainer.checkpoint.claimName" in page["row"] and "PersistentVolumeClaim" in page["row"], page
    assert page["rows"] > 300 and page["sections"] > 50, page
    assert not browser.errors, browser.errors
