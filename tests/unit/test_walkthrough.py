"""docs/walkthrough.md stays true to the code: every app file it names exists, every function it
names ``in`` a file is defined there, and every function a step is named after is a function of
the app (the blueprint of the file it names registers it). Its path (the files its steps link)
names each file once, at most 20 of them, as many as it says, each for a function it names
there."""

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
NAMED = re.compile(r"`((?:shared|functions)/[\w/.]*(?:\.py|/))`")  # a file or folder named in backticks
COUNT = re.compile(r"The path names (\d+) app files")
MAX_PATH = 20
STARTS = {"function_app.py"}  # where the app starts: it registers the blueprints, and defines no function


def path_section(text: str) -> str:
    """The steps: from "## Step by step" to the next heading."""
    start = text.index("## Step by step")
    return text[start:text.index("\n#", start + 1)]


def path_files(text: str) -> list[str]:
    """The files the steps link, in order."""
    return LINK.findall(path_section(text))


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


def test_every_file_or_folder_it_names_exists() -> None:
    named = set(NAMED.findall(DOC.read_text(encoding="utf-8")))
    assert len(named) >= 10, named
    assert [n for n in sorted(named) if not (REPO_ROOT / n).exists()] == []


def test_the_path_names_each_file_once_and_as_many_as_it_says() -> None:
    text = DOC.read_text(encoding="utf-8")
    files = path_files(text)
    assert [f for f in files if files.count(f) > 1] == []
    assert len(files) <= MAX_PATH, files
    assert [int(n) for n in COUNT.findall(text)] == [len(files)]


def test_every_file_on_the_path_is_opened_for_a_function_it_names_there() -> None:
    text = DOC.read_text(encoding="utf-8")
    section = path_section(text)
    opened = {f for _, f in NAMED_IN.findall(section)} | {f for _, f in STEP.findall(section)}
    assert [f for f in path_files(text) if f not in opened | STARTS] == []


def test_what_is_called_on_the_way_is_not_on_the_path() -> None:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("### Called on the way")
    called = set(NAMED.findall(text[start:text.index("\n#", start + 1)]))
    assert len(called) >= 5, called
    assert called & set(path_files(text)) == set()
