"""Reading the documents users hand us — cluster YAML, plans and other JSON — within bounds.

Nothing walks a document before these limits hold, so no input makes a command run for ever, eat
memory or die in a traceback:

* **files**: regular files only (a FIFO would block ``open``), at most ``MAX_YAML_BYTES`` /
  ``MAX_JSON_BYTES``, UTF-8 text;
* **YAML**: one pass over the parser's events (a loop, no recursion) bounds the nesting depth
  (``MAX_DEPTH``) and the event count; then the composed node graph's *expanded* size is counted
  with each distinct node once (aliases make a DAG: a 300-byte "billion laughs" document has ~50
  distinct nodes that expand to 10^9 values) and must stay under ``MAX_VALUES`` before anything is
  constructed; recursive aliases are refused;
* **JSON**: the same depth and value limits on the parsed value;
* **duplicate keys** in a mapping are errors naming the field and the line (YAML and JSON alike:
  a second ``gpus:`` or ``nodes:`` must not silently replace the first);
* numbers too long for Python's int conversion (4,300 digits) are one error line.

Every problem is a ``SpecError`` naming the file (and line where there is one).
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from planner.errors import SpecError
from planner.fields import join

MAX_YAML_BYTES = 2 << 20
MAX_JSON_BYTES = 64 << 20
MAX_DEPTH = 64
MAX_VALUES = 1_000_000
_MERGE = "tag:yaml.org,2002:merge"
_FAST = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when present (same events)


def _unreadable(exc: Exception, file: str) -> SpecError:
    if "digits" in str(exc):
        return SpecError("", "a number has more than 4300 digits", "write realistic numbers", file)
    return SpecError("", f"a value cannot be read ({type(exc).__name__})", "fix the value", file)


def check_regular_file(path: str | Path, what: str) -> None:
    """A ``SpecError`` naming the file unless it is an existing regular file (a FIFO or a device
    would block or never end)."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise SpecError("", f"cannot read {what} file: {exc.strerror}", "check the path", str(path)) from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise SpecError("", f"the {what} file is {kind}", f"pass a {what} file", str(path))


def read_user_text(path: Path, what: str, max_bytes: int = MAX_JSON_BYTES) -> str:
    """A user's text file; anything but a readable regular UTF-8 file within ``max_bytes`` is a
    ``SpecError`` naming the file."""
    file = str(path)
    check_regular_file(path, what)
    try:
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as exc:
        raise SpecError("", f"cannot read {what} file: {exc.strerror}", "check the path", file) from None
    if len(raw) > max_bytes:
        raise SpecError("", f"the {what} file is larger than {max_bytes >> 20} MiB", f"pass a real {what} file", file)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError("", f"the {what} file is not UTF-8 text", f"pass a {what} file", file) from None


# ------------------------------------------------------------------------------------------ YAML


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (``paths``: mapping node id -> its field path)."""

    paths: dict[int, str] = {}

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE:
                continue
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if not isinstance(key, str | int | float | bool):
                continue  # the strict readers report a non-string key
            if key in seen:
                raise SpecError(join(self.paths.get(id(node), ""), str(key)),
                                f"duplicate key (first at line {seen[key]})", "keep one of them", line=line)
            seen[key] = line
        return super().construct_mapping(node, deep)  # type: ignore[no-any-return]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_events(text: str) -> None:
    """Depth and event count, from the parser's event stream (iterative; nothing is built)."""
    depth = events = 0
    for event in yaml.parse(text, Loader=_FAST):
        events += 1
        if isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                mark = event.start_mark
                raise SpecError("", f"nested more than {MAX_DEPTH} levels deep", "flatten the document",
                                line=mark.line + 1 if mark else None)
        elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
            depth -= 1
        if events > MAX_VALUES:
            raise SpecError("", f"more than {MAX_VALUES} values", "this is not a cluster file")


def _check_expansion(root: yaml.Node) -> None:
    """The expanded value count (aliases counted at every use) and no recursive alias; each
    distinct node is visited once (iterative depth-first walk with a post-order marker)."""
    size: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, leaving = stack.pop()
        key = id(node)
        if leaving:
            open_.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in _children(node))
            if size[key] > MAX_VALUES:
                raise SpecError("", f"expands to more than {MAX_VALUES} values (an alias bomb?)",
                                "write the document without nested aliases", line=node.start_mark.line + 1)
            continue
        if key in size:
            continue
        if key in open_:
            raise SpecError("", "an alias refers to a node that contains it", "remove the recursive alias",
                            line=node.start_mark.line + 1)
        open_.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in size)


def _node_paths(root: yaml.Node) -> tuple[dict[int, str], dict[str, int]]:
    """(mapping/sequence node id -> field path, field path -> 1-based line); each node once."""
    ids: dict[int, str] = {}
    lines: dict[str, int] = {}
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if id(node) in ids:
            continue
        ids[id(node)] = path
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    sub = join(path, str(key.value))
                    lines.setdefault(sub, key.start_mark.line + 1)
                    stack.append((value, sub))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                sub = join(path, i)
                lines.setdefault(sub, item.start_mark.line + 1)
                stack.append((item, sub))
    return ids, lines


def _compose(text: str) -> yaml.Node | None:
    _check_events(text)
    root = yaml.compose(text, Loader=_FAST)
    if root is not None:
        _check_expansion(root)
    return root


def load_yaml_document(text: str, file: str) -> tuple[Any, dict[str, int]]:
    """(data, field path -> line) of a YAML text, within the module's limits."""
    try:
        root = _compose(text)
        if root is None:
            return None, {}
        ids, lines = _node_paths(root)
        loader = _StrictLoader("")
        loader.paths = ids
        try:
            return loader.construct_document(root), lines
        finally:
            loader.dispose()
    except SpecError as exc:
        raise exc.with_file(file) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = getattr(exc, "problem", None) or str(exc).strip().splitlines()[0]
        raise SpecError("", f"not valid YAML{where}: {what}", "fix the syntax", file) from None
    except (ValueError, OverflowError) as exc:  # e.g. an integer of more than 4,300 digits
        raise _unreadable(exc, file) from None


def load_yaml_text(text: str, file: str) -> Any:
    """The data of a YAML text, within the module's limits."""
    return load_yaml_document(text, file)[0]


def yaml_field_lines(text: str) -> dict[str, int]:
    """Field path (as in ``SpecError.path``: ``nodes[0].intra_link.kind``) -> 1-based line."""
    try:
        root = _compose(text)
    except (SpecError, yaml.YAMLError, ValueError):
        return {}
    return _node_paths(root)[1] if root is not None else {}


def line_of(lines: dict[str, int], path: str) -> int | None:
    """The line of ``path`` or of its nearest enclosing field that the file has."""
    while path:
        if path in lines:
            return lines[path]
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
    return None


# ------------------------------------------------------------------------------------------ JSON


class _Pairs(list):  # type: ignore[type-arg]
    """A JSON object as parsed: its (key, value) pairs in order, duplicates kept."""


def _json_line(text: str, key: str) -> int | None:
    """Line of the second ``"key":`` in ``text`` when the key occurs exactly twice (else unknown)."""
    hits = list(re.finditer(re.escape(json.dumps(key)) + r"\s*:", text))
    return text.count("\n", 0, hits[1].start()) + 1 if len(hits) == 2 else None


def _plain(value: Any, text: str, path: str, depth: int, count: list[int]) -> Any:
    """Dicts from ``_Pairs`` (duplicate keys refused), within the depth and value limits."""
    count[0] += 1
    if count[0] > MAX_VALUES:
        raise SpecError("", f"more than {MAX_VALUES} values", "pass a smaller document")
    if depth > MAX_DEPTH:
        raise SpecError("", f"nested more than {MAX_DEPTH} levels deep", "flatten the document")
    if isinstance(value, _Pairs):
        out: dict[str, Any] = {}
        for key, item in value:
            if key in out:
                raise SpecError(join(path, key), "duplicate key", "keep one of them", line=_json_line(text, key))
            out[key] = _plain(item, text, join(path, key), depth + 1, count)
        return out
    if isinstance(value, list):
        return [_plain(item, text, join(path, i), depth + 1, count) for i, item in enumerate(value)]
    return value


def load_json_text(text: str, file: str) -> Any:
    """Parse JSON text within the module's limits; every problem is a ``SpecError`` naming ``file``."""
    try:
        raw = json.loads(text, object_pairs_hook=_Pairs)
    except json.JSONDecodeError as exc:
        raise SpecError("", f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}", "fix the JSON",
                        file) from None
    except RecursionError:
        raise SpecError("", f"nested more than {MAX_DEPTH} levels deep", "flatten the document", file) from None
    except ValueError as exc:  # an integer of more than 4,300 digits
        raise _unreadable(exc, file) from None
    try:
        return _plain(raw, text, "", 0, [0])
    except SpecError as exc:
        raise exc.with_file(file) from None


def load_json_file(path: str | Path, what: str) -> Any:
    """A JSON file (regular, bounded, UTF-8, no duplicate keys)."""
    return load_json_text(read_user_text(Path(path), what), str(path))
