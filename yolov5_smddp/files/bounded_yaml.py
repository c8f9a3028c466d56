"""The one reader of the YAML files users give us (data.yaml, hyp files, model yamls), bounded.

A YAML file from a shared bucket or a mistyped edit must end in one clear line, never a traceback, a
hang or a memory bomb. Before anything is built from it:
- only a regular file is opened (bounded_read), and at most `MAX_YAML_BYTES` are read;
- the text must be UTF-8 (the error names the byte offset);
- nesting is at most `MAX_DEPTH` levels (PyYAML's composer recurses per level: 100,000 levels would
  raise RecursionError);
- the document, with every alias (`*name`) expanded, has at most `MAX_NODES` nodes (a "billion laughs"
  file of a few hundred bytes expands to 10^9), and no alias refers to a node that contains it;
- explicit tags (`!!python/object/apply:os.system`, `!!binary`, `!custom`) are refused: plain YAML
  scalars, lists and mappings are all a config needs;
- integers beyond 64 bits are refused (they overflow wherever they are used); the message names the key
  (`lr0`, `anchors[2][1]`) as well as the line and column.
Scalars resolve as YAML 1.1 (PyYAML's safe loader): `yes`/`NO`/`off` are booleans; callers that need
strings check their types.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from yolov5_smddp.files.bounded_read import UnreadableFile, read_limited, shown

MAX_YAML_BYTES = 1024 * 1024
"""1 MiB: a data.yaml naming 10,000 classes is ~200 KB; configs are a few KB."""
MAX_DEPTH = 64
"""Nesting levels (a model yaml needs 4: mapping, layer list, row, args)."""
MAX_NODES = 1_000_000
"""Nodes of the document with aliases expanded (a 10,000-class names list is 10,001)."""
MAX_INT_BITS = 63


class _Refused(Exception):
    """A bound of this module was hit; the message says which."""


def _where(mark: Any) -> str:
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def _at(node_or_event: Any) -> str:
    return _where(getattr(node_or_event, "start_mark", None))


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader (the pure-Python composer, whose hooks this overrides) with the bounds above."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self._depth = 0
        self.key_of: dict[int, str] = {}  # id(scalar node) -> its key path, for messages

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if not isinstance(event, yaml.AliasEvent):
            tag = getattr(event, "tag", None)
            if tag not in (None, "!"):
                raise _Refused(f"has the YAML tag {tag!r}{_at(event)}; tags are not allowed in a config")
            if self._depth >= MAX_DEPTH:
                raise _Refused(f"is nested deeper than {MAX_DEPTH} levels{_at(event)}")
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node: Any) -> int:
        value = super().construct_yaml_int(node)
        if abs(value) >= 2**MAX_INT_BITS:
            key = self.key_of.get(id(node))
            named = f" under the key {key!r}" if key else ""
            raise _Refused(f"has an integer beyond 64 bits{named}{_at(node)} ({node.value[:40]!r})")
        return value


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def _expanded_nodes(root: Any) -> int:
    """Nodes of the composed graph `root` with aliases expanded (shared nodes counted per use), up to
    just over MAX_NODES; _Refused when an alias refers to a node that contains it."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: Any) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise _Refused(f"has an alias that refers to a node containing it{_at(node)}")
        open_nodes.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [item for pair in node.value for item in pair]
        else:
            children = []
        for child in children:
            total = min(total + size(child), MAX_NODES + 1)
        open_nodes.discard(key)
        sizes[key] = total
        return total

    return size(root)  # depth is bounded by MAX_DEPTH, so this recursion is too


def _key_paths(root: Any) -> dict[int, str]:
    """id(scalar node) -> where it sits ("lr0", "anchors[2][1]"), each node visited once (aliases are
    shared, and MAX_NODES has bounded the document already)."""
    paths: dict[int, str] = {}
    seen: set[int] = set()
    stack: list[tuple[Any, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = str(key_node.value)[:40] if isinstance(key_node, yaml.ScalarNode) else "?"
                stack.append((value_node, f"{path}.{key}" if path else key))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(node.value))
        elif path:
            paths[id(node)] = path
    return paths


def parse_yaml(text: str, origin: str, error: type[Exception]) -> Any:
    """The YAML document `text` as Python objects; `error(f"{origin}: <reason>")`, one line, when it is
    not valid YAML or exceeds a bound."""
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_nodes(node) > MAX_NODES:
            raise _Refused(f"expands to more than {MAX_NODES:,} nodes through its aliases (*name)")
        loader.key_of = _key_paths(node)
        return loader.construct_document(node)
    except _Refused as exc:
        raise error(f"{origin}: {exc}") from None
    except yaml.MarkedYAMLError as exc:
        problem = " ".join(str(exc.problem or exc.context or "syntax error").split())
        raise error(f"{origin}: not valid YAML: {problem}{_where(exc.problem_mark)}") from None
    except yaml.YAMLError as exc:
        raise error(f"{origin}: not valid YAML: {' '.join(str(exc).split())}") from None
    finally:
        loader.dispose()


def load_yaml(path: Path | str, error: type[Exception], *, origin: str | None = None) -> Any:
    """The YAML file `path` as Python objects, read within the bounds above. Raises `error` with one line
    naming the file (`origin`, default the path) and the bound or problem; FileNotFoundError passes
    through for the caller's own message."""
    origin = origin if origin is not None else shown(path)
    try:
        data = read_limited(path, MAX_YAML_BYTES, what="YAML file")
    except UnreadableFile as exc:
        raise error(f"{origin}: {exc}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(
            f"{origin}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); save it as UTF-8"
        ) from None
    return parse_yaml(text, origin, error)
