"""A class holds one concern: no class in ``search/`` has more than ``SEARCH_LIMIT`` lines of code, none
elsewhere more than ``LIMIT`` (docstrings, a field's docstring included, comments and blank lines not counted)."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SEARCH_LIMIT = 150
LIMIT = 200  # env, agents, dashboard


def code_lines_per_class(source: str) -> dict[str, int]:
    """Each class (by dotted name for nested ones) and its lines that hold code."""
    tree = ast.parse(source)
    docs: set[int] = set()
    for node in ast.walk(tree):
        documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        if isinstance(node, documented) and ast.get_docstring(node):
            first = node.body[0]
            docs.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
        if isinstance(node, ast.ClassDef):  # a field's docstring: a string right after the field (PEP 257)
            for field, doc in zip(node.body, node.body[1:]):
                if isinstance(field, (ast.AnnAssign, ast.Assign)) and isinstance(doc, ast.Expr) and \
                        isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str):
                    docs.update(range(doc.lineno, (doc.end_lineno or doc.lineno) + 1))
    code: set[int] = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in skip:
            code.update(range(tok.start[0], tok.end[0] + 1))
    code -= docs
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                name = prefix + child.name
                out[name] = sum(1 for n in code if child.lineno <= n <= (child.end_lineno or child.lineno))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def test_the_counter_counts_code_not_docs_or_comments():
    source = '''
class A:
    """Doc,
    two lines."""

    # a comment
    x = 1
    """x's doc,
    two lines."""

    def f(self) -> int:
        """Doc."""
        return (1 +
                2)

    class B:
        y = 2
'''
    assert code_lines_per_class(source) == {"A": 7, "A.B": 2}  # class, x, def, two lines of return, class, y


@pytest.mark.parametrize("package, limit", [("search", SEARCH_LIMIT), ("env", LIMIT), ("agents", LIMIT),
                                            ("dashboard", LIMIT)])
def test_no_class_exceeds_the_limit(package: str, limit: int):
    sizes = {f"{path.relative_to(ROOT)}:{name}": n for path in sorted((ROOT / package).rglob("*.py"))
             for name, n in code_lines_per_class(path.read_text()).items()}
    assert sizes, f"found the {package} package's classes"
    too_big = {k: n for k, n in sizes.items() if n > limit}
    assert not too_big, f"classes over {limit} code lines (split a concern out): {too_big}"
