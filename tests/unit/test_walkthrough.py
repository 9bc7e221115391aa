"""docs/walkthrough.md stays true to the code: every app file it links exists, every function it
names ``in`` a file is defined there, and every function a step is named after is a function of
the app (the blueprint of the file it names registers it)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import azure.functions as func

from local.procs import REPO_ROOT

DOC = REPO_ROOT / "docs" / "walkthrough.md"
LINK = re.compile(r"\]\(\.\./([\w/.]+\.py)\)")
NAMED_IN = re.compile(r"`([\w.]+)`(?:\*\*)?\s+in\s+\[`([\w/.]+\.py)`\]")  # `submit` in [`shared/api/orders.py`]
# **2. `submit_order`** ([`functions/orders.py`]
STEP = re.compile(r"\*\*\d+\. `(\w+)`\*\* \(\[`(functions/\w+\.py)`\]")


def defined(path: Path) -> set[str]:
    """The functions and classes of ``path``, methods as ``Class.method``."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            names |= {f"{node.name}.{m.name}" for m in node.body
                      if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return names


def registered(path: str) -> set[str]:
    """The app's functions the blueprint of ``functions/<name>.py`` registers."""
    app = func.FunctionApp()
    app.register_functions(importlib.import_module(path[:-3].replace("/", ".")).bp)
    return {f.get_function_name() for f in app.get_functions()}


def test_every_file_the_walkthrough_links_exists() -> None:
    text = DOC.read_text(encoding="utf-8")
    files = set(LINK.findall(text))
    assert len(files) >= 10, files
    assert [f for f in sorted(files) if not (REPO_ROOT / f).is_file()] == []


def test_every_function_it_names_in_a_file_is_defined_there() -> None:
    text = DOC.read_text(encoding="utf-8")
    named = NAMED_IN.findall(text)
    assert len(named) >= 6, named
    assert [(name, f) for name, f in named if name not in defined(REPO_ROOT / f)] == []


def test_every_step_is_named_after_a_function_of_the_app() -> None:
    steps = STEP.findall(DOC.read_text(encoding="utf-8"))
    assert {f for _, f in steps} >= {"functions/orders.py", "functions/agents.py", "functions/scheduler.py",
                                      "functions/supervisor.py"}, steps
    assert [(name, f) for name, f in steps if name not in registered(f)] == []
