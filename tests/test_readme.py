"""README.md's commands run as written, top to bottom: every variable a ``sh`` block uses is set
before (in that block or an earlier one), the ``local.stackinfo`` commands that set them print
nothing and exit 1 without a traceback when no stack runs, and so does the whole quick start; with
a stack running (keys checked, as ``make run`` starts it), the quick start's blocks post an order,
read it back and play the operator with the keys they read. (tests/e2e/test_stack.py covers what
``local.stackinfo`` prints.)"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from local.procs import REPO_ROOT

README = REPO_ROOT / "README.md"
MAX_LINES = 300
ENVIRONMENT = {"HOME", "PATH", "PWD", "USER"}  # set by any shell, not by the README

NAME = r"[A-Za-z_][A-Za-z0-9_]*"
USE = re.compile(r"\$\{?(" + NAME + ")")
# A variable is set by an assignment that starts a command (export X=..., a=1 b=2 cmd), by for or read.
SETS = re.compile(r"(?:^|[;&|({]|\$\()[ \t]*(?:(?:export|local|readonly)[ \t]+)?(" + NAME + ")=", re.M)
LOOPS = re.compile(r"\bfor[ \t]+(" + NAME + r")[ \t]+in\b|\bread[ \t]+(?:-\w+[ \t]+)*(" + NAME + ")")


def sh_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```(?:sh|bash)\n(.*?)^```", markdown, re.S | re.M)


def section(markdown: str, title: str) -> str:
    return markdown.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def code_only(block: str) -> str:
    """The block with what the shell does not expand blanked out, offsets kept: single-quoted
    text, escaped characters and comments (a line continuation stays a line break)."""
    out: list[str] = []
    i, quoted = 0, False
    while i < len(block):
        c = block[i]
        if c == "\\":
            out.append(" \n" if block[i + 1:i + 2] == "\n" else "  ")
            i += 2
            continue
        if quoted:
            quoted = c != '"'
            out.append(c)
            i += 1
            continue
        end = i
        if c == "'":
            end = block.find("'", i + 1)
        elif c == "#" and (i == 0 or block[i - 1].isspace()):
            end = block.find("\n", i) - 1
        if end != i:
            end = len(block) - 1 if end < 0 else end
            out.append(re.sub(r"[^\n]", " ", block[i:end + 1]))
            i = end + 1
            continue
        quoted = c == '"'
        out.append(c)
        i += 1
    return "".join(out)


def used_before_set(blocks: list[str]) -> list[str]:
    """``$NAME (block N): line`` for each use of a variable that no earlier text sets."""
    problems, known = [], set(ENVIRONMENT)
    for number, block in enumerate(blocks, 1):
        code = code_only(block)
        sets = [(m.start(1), m.group(1)) for m in SETS.finditer(code)]
        sets += [(m.start(), m.group(1) or m.group(2)) for m in LOOPS.finditer(code)]
        for use in USE.finditer(code):
            name = use.group(1)
            if name not in known and not any(at < use.start() and n == name for at, n in sets):
                line = block[:use.start()].count("\n")
                problems.append(f"${name} (block {number}): {block.splitlines()[line].strip()}")
        known |= {name for _, name in sets}
    return problems


def substitutions(code: str, block: str) -> list[str]:
    """The text of each ``$(...)`` at the top level of ``block`` (``code`` is its code_only)."""
    found, depth, start = [], 0, 0
    for i, c in enumerate(code):
        if code.startswith("$(", i):
            if depth == 0:
                start = i + 2
            depth += 1
        elif c == ")" and depth:
            depth -= 1
            if depth == 0:
                found.append(block[start:i])
    return found


def stackinfo_commands(markdown: str) -> list[str]:
    """Every ``$(...)`` of the sh blocks that runs local.stackinfo, as written."""
    return [text for block in sh_blocks(markdown) for text in substitutions(code_only(block), block)
            if "-m local.stackinfo" in text]


def without_stack(command: str, state_dir: Path) -> str:
    """``command`` reading an empty state folder (no stack there), with this test's Python."""
    return (command.replace(".venv/bin/python", shlex.quote(sys.executable))
            .replace("-m local.stackinfo", f"-m local.stackinfo --state-dir {shlex.quote(str(state_dir))}"))


def _bash(script: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}  # a fresh shell
    return subprocess.run(["bash", "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


# --------------------------------------------------------------------------- README.md as it is

def test_the_readme_is_short() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= MAX_LINES


def test_every_variable_is_set_before_it_is_used() -> None:
    blocks = sh_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) >= 3
    assert used_before_set(blocks) == []


def test_the_stackinfo_commands_without_a_stack_print_nothing_and_say_why(tmp_path: Path) -> None:
    commands = stackinfo_commands(README.read_text(encoding="utf-8"))
    for command in commands:
        r = _bash(without_stack(command, tmp_path))
        assert "not running" in r.stderr and "Traceback" not in r.stderr, (command, r.stderr)
        assert (r.returncode, r.stdout) == (1, ""), (command, r)
    assert len(commands) >= 2, commands  # BASE= and REMOTES= at least


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("python3")), reason="needs curl and python3")
def test_the_quick_start_without_a_stack_fails_cleanly(tmp_path: Path) -> None:
    """Its blocks (all but `make run` / `make test`), in order, in one fresh shell, no stack running."""
    blocks = [b for b in sh_blocks(section(README.read_text(encoding="utf-8"), "Quick start"))
              if not re.search(r"^make\b", b, re.M)]
    assert len(blocks) >= 2
    r = _bash(without_stack("\n".join(blocks), tmp_path))
    assert "not running" in r.stderr, r
    assert "Traceback" not in r.stdout + r.stderr, r.stderr


@pytest.mark.integration
@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("python3")), reason="needs curl and python3")
def test_the_quick_start_runs_top_to_bottom_against_a_running_stack(tmp_path: Path) -> None:
    """Its blocks, in order, in one fresh shell, against a stack that checks keys: each request
    carries the key the README reads (a missing one would be a 401 with an empty body, which
    ``json.tool`` refuses)."""
    from local.stack import Stack

    blocks = [b for b in sh_blocks(section(README.read_text(encoding="utf-8"), "Quick start"))
              if not re.search(r"^make\b", b, re.M)]
    with Stack(tmp_path / "stack", persistent=False, instances=1) as stack:
        assert stack.keys is not None
        r = _bash(without_stack("\n".join(blocks), stack.state_dir))
    assert r.returncode == 0 and "Traceback" not in r.stderr and "Expecting value" not in r.stderr, r
    assert '"orderId"' in r.stdout and '"processState"' in r.stdout, r.stdout  # the order read back
    assert '"orders": [' in r.stdout, r.stdout  # the operator's search


# --------------------------------------------------------------------------- the checks themselves

def test_a_variable_used_before_it_is_set_is_found() -> None:
    blocks = ['curl "$BASE/api/orders/$ORDER"  # $NOTE in a comment', "BASE=$(x)\nORDER=$(y \"$BASE\")",
              'echo "${ORDER}" \'$QUOTED\' \\$ESCAPED $1\nfor F in a; do echo $F; done\nexport E=1; echo $E']
    assert used_before_set(blocks) == ['$BASE (block 1): curl "$BASE/api/orders/$ORDER"  # $NOTE in a comment',
                                       '$ORDER (block 1): curl "$BASE/api/orders/$ORDER"  # $NOTE in a comment']
    assert used_before_set(["az --parameters A=1\necho $A"]) == ["$A (block 1): echo $A"]


def test_a_stackinfo_pipeline_is_taken_whole(tmp_path: Path) -> None:
    """The pipeline README.md had: stackinfo's nothing, then a traceback from json.load."""
    old = ("REMOTES=$(.venv/bin/python -m local.stackinfo --key remotes | python3 -c "
           "'import json,sys; print(json.load(sys.stdin)[\"baseUrl\"])')\n")
    assert stackinfo_commands(f"```sh\n{old}```\n") == [old[len("REMOTES=$("):-2]]
    r = _bash(without_stack(stackinfo_commands(f"```sh\n{old}```\n")[0], tmp_path))
    assert "Traceback" in r.stderr
