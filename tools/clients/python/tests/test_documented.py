"""Every public module, class, function and method of the package has a docstring (the rule
the Swift library follows for its public declarations)."""

from __future__ import annotations

import ast
from pathlib import Path

import accessoryhost


def test_every_public_symbol_has_a_docstring() -> None:
    missing = []
    for path in sorted(Path(accessoryhost.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text())
        if ast.get_docstring(tree) is None:
            missing.append(f"{path.name}: the module")

        def visit(node: ast.AST, owner: str, inside_public: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = child.name
                    public = inside_public and not name.startswith("_")
                    if public and ast.get_docstring(child) is None:
                        missing.append(f"{path.name}: {owner}{name}")
                    if isinstance(child, ast.ClassDef):
                        visit(child, f"{owner}{name}.", public)
        visit(tree, "", not path.name.startswith("_"))
    assert not missing, "public symbols without a docstring: " + ", ".join(missing)
