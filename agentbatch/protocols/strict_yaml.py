"""YAML as people write config files: `safe_load` that refuses a key given twice in one mapping.

PyYAML keeps the later value of a duplicate key without a word, so a setting typed twice (two
`limit:` lines, a pasted block) silently decides the run. A merge key (`<<: *base`) may still be
overridden by the mapping's own keys, as YAML defines.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode

MERGE_TAG = "tag:yaml.org,2002:merge"


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                seen = first_line.get(key)
            except TypeError:  # an unhashable key: the base constructor reports it
                continue
            if seen is not None:
                raise ConstructorError("while constructing a mapping", node.start_mark,
                                       f"found duplicate key {key!r} (first given on line {seen + 1})",
                                       key_node.start_mark)
            first_line[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def safe_load(text: str) -> Any:
    """`yaml.safe_load`, except that a duplicate key raises `yaml.YAMLError` naming its line."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
