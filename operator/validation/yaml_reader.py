"""Reading manifest files the way kubectl does, with bounded work on hostile input.

kubectl turns each YAML document into JSON before the API server sees it, so this reader keeps
to what survives that step and refuses the rest with file:line:
- duplicate keys are errors (a YAML parser silently keeps one of the two values); keys merged in
  with `<<: *anchor` are not duplicates, and explicit keys override them, as in kubectl;
- timestamps stay strings and YAML 1.2 exponent floats (1e-6) are numbers;
- `kind: List` files (what `kubectl get -o yaml` prints) are read item by item;
- values JSON cannot carry (.inf, .nan, binary, integers beyond int64) are errors naming the field.

Bounds, because `kuberl validate` runs in CI on files from anyone: regular files only (a FIFO or
/dev/zero would block or never end), the file's size (the API server's request limit), the number
of documents, nesting depth (no RecursionError), and alias expansion (a few kilobytes of
`&a [*a, *a, ...]` must not expand into gigabytes: kubectl's YAML reader refuses such documents too
since CVE-2019-11253). Aliases are counted as they are composed, before anything expands them, in
values per document and in values and scalar bytes per file (a long string repeated by aliases is
small in memory but huge once written as JSON for the API server).
"""

from __future__ import annotations

import math
import os
import re
import stat
from dataclasses import dataclass
from typing import Any, BinaryIO

import yaml

from .problems import ManifestError, Problem, format_path

MAX_FILE_BYTES = 3 * 1024 * 1024
"""The API server refuses request bodies over 3 MiB; no manifest needs more."""
MAX_DEPTH = 100
"""Nested mappings and sequences; an RLJob nests about 10 deep, free-form fields a few more."""
MAX_NODES = 100_000
"""Nodes of one document after alias expansion; an RLJob has a few hundred."""
MAX_FILE_NODES = 1_000_000
"""Values of all documents of one file after alias expansion."""
MAX_EXPANDED_BYTES = 16 * 1024 * 1024
"""Scalar bytes of one file after alias expansion; without aliases a file expands to at most its size."""
MAX_DOCUMENTS = 1000
"""Documents of one file; a manifest holds a few."""
INT64 = (-(2**63), 2**63 - 1)

_YAML12_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)[eE][-+]?[0-9]+$")
_MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass(frozen=True)
class Document:
    """One object of a manifest file."""

    file: str
    line: int
    """The line where the document (or List item) starts, from 1."""
    label: str
    """Which object of the file: "document 2", "item 0", "document 1, item 3"; empty when it is the only one."""
    content: Any

    @property
    def source(self) -> str:
        """How problems name the object: the file, and the label when there are several."""
        return f"{self.file} ({self.label})" if self.label else self.file

    @property
    def start(self) -> str:
        """Where the object starts: file:line, and the label; for problems of the whole object."""
        return f"{self.file}:{self.line} ({self.label})" if self.label else f"{self.file}:{self.line}"


class _LimitError(yaml.MarkedYAMLError):
    pass


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads like kubectl's YAML-to-JSON step, within MAX_DEPTH and MAX_NODES."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0
        self._file_nodes = 0
        self._file_bytes = 0
        self._documents = 0
        self._sizes: dict[int, tuple[int, int]] = {}
        """id of a composed node -> (values, scalar bytes) it expands to."""

    # --- composing: depth and alias expansion are counted here, before anything is built ---

    def compose_document(self) -> yaml.Node | None:
        self._documents += 1
        if self._documents > MAX_DOCUMENTS:
            raise _LimitError(None, None, f"more than {MAX_DOCUMENTS} documents in one file: split it", self.peek_event().start_mark)
        self._nodes, self._sizes = 0, {}
        return super().compose_document()

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            target = self.anchors.get(event.anchor)
            if target is not None:
                if id(target) not in self._sizes:
                    raise _LimitError(
                        None, None, f"alias *{event.anchor} refers to a node that contains it: JSON cannot hold a cycle", event.start_mark
                    )
                self._count(*self._sizes[id(target)], event)
            return super().compose_node(parent, index)
        collection = isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent))
        if collection:
            self._depth += 1
            if self._depth > MAX_DEPTH:
                raise _LimitError(None, None, f"nested more than {MAX_DEPTH} levels deep", event.start_mark)
        before = (self._nodes, self._file_bytes)
        self._count(1, len(event.value) if isinstance(event, yaml.ScalarEvent) else 0, event)
        node = super().compose_node(parent, index)
        if collection:
            self._depth -= 1
        self._sizes[id(node)] = (self._nodes - before[0], self._file_bytes - before[1])
        return node

    def _count(self, nodes: int, scalar_bytes: int, event: yaml.Event) -> None:
        self._nodes += nodes
        self._file_nodes += nodes
        self._file_bytes += scalar_bytes
        aliases = "aliases repeat what they refer to; kubectl refuses such alias bombs too"
        if self._nodes > MAX_NODES:
            raise _LimitError(None, None, f"the document expands to more than {MAX_NODES} values ({aliases})", event.start_mark)
        if self._file_nodes > MAX_FILE_NODES:
            raise _LimitError(None, None, f"the file expands to more than {MAX_FILE_NODES} values ({aliases})", event.start_mark)
        if self._file_bytes > MAX_EXPANDED_BYTES:
            raise _LimitError(
                None, None, f"the file expands to more than {MAX_EXPANDED_BYTES // 2**20} MiB of text ({aliases})", event.start_mark
            )

    # --- constructing ---

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue  # merged keys may be overridden by explicit ones, as in kubectl
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    "found a key that is a list or mapping: JSON keys are strings",
                    key_node.start_mark,
                ) from None
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark, f"found duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            raise yaml.constructor.ConstructorError(None, None, "integer too large", node.start_mark) from None


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
# Timestamps stay strings (JSON has no dates); YAML 1.2 exponent floats become floats.
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _YAML12_FLOAT, list("-+.0123456789"))


def read_manifest_text(path: str | os.PathLike[str]) -> str:
    """The text of a manifest file: a regular file of at most MAX_FILE_BYTES, as UTF-8. Opened without
    blocking (a FIFO with no writer would wait forever) and read no further than the bound (/dev/zero
    never ends). OSError and UnicodeDecodeError carry what is wrong; the caller names the file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(f"{path} is a directory")
        if not stat.S_ISREG(mode):
            raise ManifestError(
                [
                    Problem(
                        str(path),
                        "",
                        "not a regular file (a device, FIFO or socket): name a manifest file, or redirect the stream into one",
                    )
                ]
            )
        with os.fdopen(fd, "rb", closefd=False) as f:
            return read_manifest_stream(f, str(path))
    finally:
        os.close(fd)


def read_manifest_stream(stream: BinaryIO, source: str) -> str:
    """The text of a manifest read from an open binary stream (stdin for `kuberl submit -f -`): at most
    MAX_FILE_BYTES, as UTF-8, reading no further than the bound (a stream may never end)."""
    data = stream.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ManifestError([Problem(source, "", f"larger than {MAX_FILE_BYTES // 2**20} MiB, the API server's request limit")])
    return data.decode("utf-8")


def read_documents(text: str, source: str) -> list[Document]:
    """The non-empty documents of `text`, with `kind: List` files unfolded into their items."""
    if len(text.encode("utf-8", errors="replace")) > MAX_FILE_BYTES:
        raise ManifestError([Problem(source, "", f"larger than {MAX_FILE_BYTES // 2**20} MiB, the API server's request limit")])
    found: list[tuple[Any, int]] = []
    loader = None
    try:
        loader = _Loader(text)  # the reader checks every character here
        while loader.check_node():
            node = loader.get_node()
            doc = loader.construct_document(node) if node is not None else None
            if doc is not None:
                found.append((doc, node.start_mark.line + 1))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        kind = (
            "refused"
            if isinstance(exc, _LimitError)
            else "YAML syntax error"
            if isinstance(exc, (yaml.scanner.ScannerError, yaml.parser.ParserError))
            else "YAML error"
        )
        raise ManifestError([Problem(where, "", f"{kind}: {exc.problem or exc}")]) from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise ManifestError([Problem(f"{source}:{line}", "", f"YAML error: character {exc.character:#x} is not allowed in YAML")]) from None
    except yaml.YAMLError as exc:
        raise ManifestError([Problem(source, "", f"YAML error: {exc}")]) from None
    finally:
        if loader is not None:
            loader.dispose()
    labels = [""] if len(found) == 1 else [f"document {i}" for i in range(1, len(found) + 1)]
    documents = []
    for label, (doc, line) in zip(labels, found):
        documents.extend(_unfold_list(Document(source, line, label, doc)))
    return documents


def _unfold_list(doc: Document) -> list[Document]:
    content = doc.content
    if not (isinstance(content, dict) and content.get("kind") == "List" and content.get("apiVersion") == "v1"):
        return [doc]
    items = content.get("items")
    if not isinstance(items, list):
        raise ManifestError([Problem(doc.source, "items", "a List needs items: a list of objects")])
    prefix = f"{doc.label}, " if doc.label else ""
    return [Document(doc.file, doc.line, f"{prefix}item {i}", item) for i, item in enumerate(items)]


def shape_problems(value: Any, source: str) -> list[Problem]:
    """The file reader's bounds for an object that was never a file (what the API server returns to the
    operator): no deeper than MAX_DEPTH, no more than MAX_NODES values. Iterative, so a hostile depth
    costs a refusal, not a RecursionError."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    nodes = 0
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if depth > MAX_DEPTH:
            return [Problem(source, "", f"nested more than {MAX_DEPTH} levels deep; an RLJob nests about 10")]
        if nodes > MAX_NODES:
            return [Problem(source, "", f"more than {MAX_NODES} values; an RLJob has a few hundred")]
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return []


def json_problems(value: Any, source: str, loc: tuple[Any, ...] = ()) -> list[Problem]:
    """What in `value` JSON (and so the API server) cannot carry, each with the field it is at."""
    if isinstance(value, dict):
        bad_keys = [
            Problem(source, format_path((*loc, str(key))), f"a {type(key).__name__} key is not JSON: keys are strings")
            for key in value
            if not isinstance(key, (str, int, float, bool, type(None)))
        ]
        return bad_keys + [p for key, item in value.items() for p in json_problems(item, source, (*loc, key))]
    if isinstance(value, list):
        return [p for i, item in enumerate(value) for p in json_problems(item, source, (*loc, i))]
    path = format_path(loc)
    if isinstance(value, float) and not math.isfinite(value):
        return [Problem(source, path, f"{value} is not a number JSON can carry: write a finite number")]
    if isinstance(value, int) and not isinstance(value, bool) and not INT64[0] <= value <= INT64[1]:
        return [Problem(source, path, "integer does not fit in 64 bits, the API server's integers")]
    if value is None or isinstance(value, (str, int, float, bool)):
        return []
    return [
        Problem(
            source, path, f"a {type(value).__name__} value (from a YAML tag) is not JSON: write a string, number, boolean, list or mapping"
        )
    ]
