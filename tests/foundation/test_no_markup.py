"""The CLI's consoles read no rich markup (``hexiscale.cli.output``: a path like ``runs/[/x]`` must
print as it is), so a markup tag in a string literal would reach the user literally
(``[bold]strategy 0: ...[/]``). Styles come from ``styled()`` only; this finds any tag in the source."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STYLES = r"(bold|dim|italic|underline|reverse|strike|blink|red|green|yellow|blue|cyan|magenta|white|black|b|i|u)"
TAG = re.compile(rf"\[/\]|\[/?{STYLES}( {STYLES})*\]")


def _literals(tree: ast.AST) -> list[tuple[int, str]]:
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_no_markup_tags_in_cli_strings() -> None:
    found = []
    for path in sorted((ROOT / "hexiscale").rglob("*.py")):
        for line, text in _literals(ast.parse(path.read_text(), str(path))):
            if TAG.search(text):
                found.append(f"{path.relative_to(ROOT)}:{line}: {text!r}")
    assert not found, "rich markup the consoles print literally; use output.styled():\n" + "\n".join(found)


def test_the_pattern_finds_a_tag() -> None:
    assert TAG.search("[bold]strategy 0[/]") and TAG.search("x [bold red]y") and not TAG.search("runs/[x]")
