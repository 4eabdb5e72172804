"""A plain tree (dicts, lists, scalars) as block YAML with a comment at the end of chosen lines.

PyYAML writes no comments, so mappings are laid out here, one key a line, and every value that is not a
non-empty mapping is written by PyYAML in flow style (`[a, b]`, `'a: b'`, `null`): quoting stays PyYAML's,
and `yaml.safe_load` of the text gives the tree back.
"""
import json
from typing import Any, Dict, Iterator, Mapping, Tuple

import yaml

Path = Tuple[str, ...]


def commented_yaml(tree: Mapping[str, Any], notes: Mapping[Path, str], header: str = "") -> str:
    """`tree` as YAML; `notes[path]` follows the line of the value at `path` (keys from the root) as `# note`."""
    lines = [f"# {line}" for line in header.splitlines()]
    lines.extend(_lines(tree, notes, ()))
    return "\n".join(lines) + "\n"


def _lines(tree: Mapping[str, Any], notes: Mapping[Path, str], where: Path) -> Iterator[str]:
    indent = "  " * len(where)
    for key, value in tree.items():
        path = (*where, str(key))
        note = f"  # {notes[path]}" if path in notes else ""
        if isinstance(value, dict) and value:
            yield f"{indent}{_flow(key)}:{note}"
            yield from _lines(value, notes, path)
        else:
            yield f"{indent}{_flow(key)}: {_flow(value)}{note}"


def _flow(value: Any) -> str:
    """One value in flow style on one line (dumped inside a list, so no document end marker follows).
    PyYAML folds a text holding line breaks over several lines; JSON's escapes keep it on one, and JSON
    is YAML."""
    text = yaml.safe_dump([value], default_flow_style=True, width=2**31, allow_unicode=True).strip()[1:-1]
    return json.dumps(value) if "\n" in text else text


def leaves(tree: Any, where: Path = ()) -> Dict[Path, Any]:
    """{path: value} of each value that is not a non-empty mapping: the values that get their own line."""
    if isinstance(tree, dict) and tree:
        found: Dict[Path, Any] = {}
        for key, value in tree.items():
            found.update(leaves(value, (*where, str(key))))
        return found
    return {where: tree}
