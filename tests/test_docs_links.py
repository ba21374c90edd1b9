"""Every relative link in README.md and docs/*.md resolves to a file or folder inside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# [text](target) and [text](target "title"); images too. Reference-style links are not used here.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~)")


def _links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every markdown link outside fenced code blocks."""
    out: list[tuple[int, str]] = []
    in_fence = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line.strip()):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        out += [(number, m.group(1)) for m in LINK.finditer(line)]
    return out


def _is_external(target: str) -> bool:
    return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target)) or target.startswith("//")


def _broken(path: Path, root: Path = REPO) -> list[str]:
    problems = []
    for number, target in _links(path):
        if _is_external(target) or target.startswith("#"):
            continue
        file_part = target.split("#", 1)[0].split("?", 1)[0]
        resolved = (path.parent / file_part).resolve()
        where = f"{path.relative_to(root)}:{number}: {target}"
        if not resolved.is_relative_to(root):
            problems.append(f"{where} points outside the repository ({resolved})")
        elif not resolved.exists():
            problems.append(f"{where} does not exist ({resolved.relative_to(root)})")
    return problems


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve_inside_repository(path: Path) -> None:
    problems = _broken(path)
    assert not problems, "\n".join(problems)


def test_checker_catches_outside_and_missing_links(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (tmp_path / "outside.md").write_text("exists, but outside the repository\n")
    (root / "docs" / "architecture.md").write_text("# rooms\n")
    doc = root / "docs" / "index.md"
    doc.write_text("[a](../../outside.md) [b](missing.md) [c](architecture.md#rooms) [d](https://example.com)\n"
                   "[e](#local) ![f](architecture.md)\n```\n[g](ignored-in-code.md)\n```\n")  # fmt: skip
    problems = _broken(doc, root)
    assert len(problems) == 2, problems
    assert "outside the repository" in problems[0] and "does not exist" in problems[1]


def test_docs_are_found() -> None:
    assert REPO / "README.md" in DOCS and len(DOCS) > 5
    assert any(target == "docs/architecture.md" for _, target in _links(REPO / "README.md"))
