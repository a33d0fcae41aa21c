"""SQL lives in hango_worker/store/: every statement named there, in one place.

No string literal outside store/ holds a SQL statement (docstrings, which may describe
one, aside). `testing/` (the test fakes, with their own tables) is not production code;
KNOWN lists the statements still outside store/, each to be moved there: the list may
only shrink.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "hango_worker"

SQL = re.compile(r"\bSELECT\b.*\bFROM\b|\bINSERT INTO\b|\bUPDATE\b.*\bSET\b|\bDELETE FROM\b", re.S)

# module → how many SQL literals it still holds (not yet moved to store/)
KNOWN = {
    "run/blobs.py": 2,
    "run/execute.py": 1,
}


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
    return {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, kinds)
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }


def sql_literals(source: str) -> list[str]:
    """The string literals (f-strings' text parts joined) that hold a SQL statement."""
    tree = ast.parse(source)
    skip = _docstrings(tree) | {
        id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values
    }
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in n.values)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip:
            text = n.value
        else:
            continue
        if SQL.search(text):
            found.append(text)
    return found


def test_no_sql_outside_store() -> None:
    found = {}
    for path in sorted(PKG.rglob("*.py")):
        where = path.relative_to(PKG)
        if where.parts[0] in ("store", "testing"):
            continue
        if n := len(sql_literals(path.read_text(encoding="utf-8"))):
            found[str(where.as_posix())] = n
    assert found == KNOWN


def test_the_check_finds_sql() -> None:
    source = '''
"""A module that says SELECT x FROM y in its docstring (allowed)."""
Q = "SELECT name FROM agents WHERE id = $1"
W = f"UPDATE runs SET status = {1}"
D = "DELETE FROM runs"
I = """
INSERT INTO t (a) VALUES ($1)
"""
OK = "select the agent from the list"
'''
    assert len(sql_literals(source)) == 4
