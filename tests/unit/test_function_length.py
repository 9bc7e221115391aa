"""No function in the app is over 60 lines (issue 44: a newcomer reads one in one screen).

The app is ``shared/``, ``functions/`` and ``function_app.py``; bench/, local/ and the tests are
tools around it. A function's lines run from its ``def`` (decorators aside) to its last line,
docstring and comments included.
"""

from __future__ import annotations

import ast

from local.procs import REPO_ROOT

MAX_LINES = 60


def long_functions() -> list[str]:
    files = [*(REPO_ROOT / "shared").rglob("*.py"), *(REPO_ROOT / "functions").rglob("*.py"),
             REPO_ROOT / "function_app.py"]
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    found.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_in_the_app_is_over_60_lines() -> None:
    assert long_functions() == []
