"""Fixtures of the infrastructure checks: the Bicep files as text, and tool venvs.

checkov has many dependencies, so it lives in its own venv (`.venv-checkov`, git-ignored by
`.venv-*`), built here on first use so that `make test` sets itself up on a fresh machine and
reused afterwards (a stamp file records the pinned version that was installed completely).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
INFRA = REPO_ROOT / "infra"
QUEUE_CONFIG = INFRA / "servicebus-config.json"
LOCAL_SETTINGS_EXAMPLE = REPO_ROOT / "local.settings.json.example"
AGENTS_JSON = REPO_ROOT / "workflows" / "agents.json"
LANES_JSON = REPO_ROOT / "workflows" / "lanes.json"

CHECKOV_VERSION = "3.3.30"
CHECKOV_VENV = REPO_ROOT / ".venv-checkov"
# Runtime packages for the publish test, keyed by the hash of requirements.txt.
PUBLISH_VENV = REPO_ROOT / ".venv-publish"

# Slow set-up (a pip install) counts against the first test's timeout.
VENV_TIMEOUT = 1500


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


@contextlib.contextmanager
def _locked(venv: Path) -> Iterator[None]:
    """One builder per venv at a time, across concurrent pytest runs."""
    key = hashlib.sha256(str(venv).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"venv-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_venv(venv: Path, stamp_value: str, pip_args: list[str]) -> Path:
    """Create `venv` with `pip_args` installed, unless its stamp already says `stamp_value`."""
    stamp = venv / ".installed"
    python = _venv_python(venv)
    with _locked(venv):
        if python.exists() and stamp.exists() and stamp.read_text().strip() == stamp_value:
            return python
        if venv.exists():
            shutil.rmtree(venv)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *pip_args],
            check=True,
        )
        stamp.write_text(stamp_value + "\n")
    return python


@pytest.fixture(scope="session")
def checkov_bin() -> Path:
    ensure_venv(CHECKOV_VENV, f"checkov=={CHECKOV_VERSION}", [f"checkov=={CHECKOV_VERSION}"])
    return CHECKOV_VENV / "bin" / "checkov"


@pytest.fixture(scope="session")
def publish_python() -> Path:
    requirements = REPO_ROOT / "requirements.txt"
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()
    return ensure_venv(PUBLISH_VENV, f"requirements.txt sha256 {digest}", ["-r", str(requirements)])


def run_checkov(checkov: Path, directory: Path) -> dict:
    """checkov's JSON report of the Bicep files under `directory` (no network, no upload)."""
    env = dict(os.environ, CKV_SKIP_PACKAGE_UPDATE_CHECK="true", BC_SKIP_MAPPING="TRUE")
    proc = subprocess.run(
        [str(checkov), "-d", str(directory), "--framework", "bicep", "-o", "json", "--skip-download", "--compact"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    # Exit code 1 means "failed checks", which the tests report from the JSON themselves.
    assert proc.returncode in (0, 1), f"checkov crashed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    report = json.loads(proc.stdout)
    if isinstance(report, list):  # one report per framework when several ran
        reports = [r for r in report if r.get("check_type") == "bicep"]
        assert len(reports) == 1, report
        report = reports[0]
    return report


# --- Bicep as text --------------------------------------------------------------------------


def bicep_files() -> list[Path]:
    return sorted(INFRA.rglob("*.bicep"))


def bicep_text(name: str) -> str:
    return (INFRA / name).read_text()


def strip_comments(text: str) -> str:
    """Bicep without // comments (strings holding // such as URLs are kept: '...' is skipped)."""
    out = []
    for line in text.splitlines():
        in_string = False
        for i, ch in enumerate(line):
            if ch == "'":
                in_string = not in_string
            elif not in_string and line.startswith("//", i):
                line = line[:i]
                break
        out.append(line.rstrip())
    return "\n".join(out)


_SETTING = re.compile(r"\{\s*name:\s*'(?P<name>[^']+)'\s*\n\s*value:\s*(?P<value>[^\n]+?)\s*\n\s*\}")
# var X = [for agent in agents: { name: agent.FIELD  value: EXPR }]: one app setting per agent.
_AGENT_LOOP = re.compile(r"^var (?P<var>\w+) = \[for agent in agents: \{\s*\n\s*name: agent\.(?P<field>\w+)\s*\n"
                         r"\s*value: (?P<value>[^\n]+?)\s*\n\s*\}\]", re.M)


def agent_catalog() -> list[dict[str, str]]:
    """The agents of workflows/agents.json, as Bicep's loadJsonContent reads them."""
    return json.loads(AGENTS_JSON.read_text())["agents"]


def bicep_agent_loops() -> dict[str, tuple[str, str]]:
    """functionapp.bicep's loops over the agents: var -> (the agent field naming the setting, value)."""
    text = strip_comments(bicep_text("modules/functionapp.bicep"))
    return {m.group("var"): (m.group("field"), m.group("value")) for m in _AGENT_LOOP.finditer(text)}


def expand_for_agent(expr: str, agent: dict[str, str]) -> str:
    """A loop's value for one agent: ${agent.x} in strings and agent.x elsewhere are replaced."""
    expr = re.sub(r"\$\{agent\.(\w+)\}", lambda m: agent[m.group(1)], expr)
    return re.sub(r"\bagent\.(\w+)", lambda m: f"'{agent[m.group(1)]}'", expr)


def bicep_app_settings() -> dict[str, str]:
    """App settings of the Function App: name -> Bicep value expression (as written; a setting
    of a loop over the agents with that agent's fields filled in, e.g. serviceUrls['X'])."""
    text = strip_comments(bicep_text("modules/functionapp.bicep"))
    start = text.index("appSettings: concat([")
    block = text[start:]
    settings: dict[str, str] = {}

    def add(name: str, value: str) -> None:
        assert name not in settings, f"app setting {name} is set twice"
        settings[name] = value

    for m in _SETTING.finditer(block):
        add(m.group("name"), m.group("value"))
    tail = re.search(r"^\s*\], (?P<vars>\w+(?:, \w+)*)\)$", block, re.M)
    assert tail, "appSettings is concat([...literal settings...], loop, ...)"
    loops = bicep_agent_loops()
    for var in tail.group("vars").split(", "):
        if var == "laneQueueSettings":
            for name, value in bicep_lane_queue_settings().items():
                add(name, f"'{value}'")
            continue
        assert var in loops, f"appSettings concatenates {var}, which is not a loop over the agents"
        field, value = loops[var]
        for agent in agent_catalog():
            add(agent[field], expand_for_agent(value, agent))
    return settings


def fast_lanes() -> list[str]:
    """The lanes of workflows/lanes.json but the first, as Bicep's skip(laneCatalog.lanes, 1) reads them."""
    return [lane["name"] for lane in json.loads(LANES_JSON.read_text())["lanes"][1:]]


# The one loop over (fast lanes x work queues) of functionapp.bicep, pinned: no compiler is reachable,
# so the test reads this exact text and evaluates it below (i / count: the lane, i % count: the queue).
_LANE_SETTINGS_LOOP = (
    "var laneQueueSettings = [for i in range(0, length(fastLanes) * workQueueCount): {\n"
    "  name: '${workQueues[i % workQueueCount].setting}${toUpper(take(fastLanes[i / workQueueCount].name, 1))}"
    "${skip(fastLanes[i / workQueueCount].name, 1)}'\n"
    "  value: '${workQueues[i % workQueueCount].queue}-${fastLanes[i / workQueueCount].name}'\n"
    "}]"
)
_AGENT_WORK_QUEUES = ("var agentWorkQueues = [for agent in agents: {\n  setting: agent.queueSetting\n"
                      "  queue: 'agent-${agent.name}'\n}]")


def bicep_lane_queue_settings() -> dict[str, str]:
    """functionapp.bicep's lane queue settings, evaluated: setting name -> queue name."""
    text = strip_comments(bicep_text("modules/functionapp.bicep"))
    assert _LANE_SETTINGS_LOOP in text, "functionapp.bicep's laneQueueSettings loop is not the one the tests read"
    assert _AGENT_WORK_QUEUES in text
    head = re.search(r"^var workQueues = concat\(\[\n(?P<body>.*?)^\], agentWorkQueues\)$", text, re.S | re.M)
    assert head, "var workQueues = concat([...], agentWorkQueues) not found"
    assert re.search(r"^var workQueueCount = length\(workQueues\)$", text, re.M)
    work = re.findall(r"setting: '(\w+)'\s*\n\s*queue: '([\w-]+)'", head.group("body"))
    work += [(a["queueSetting"], f"agent-{a['name']}") for a in agent_catalog()]
    return {f"{setting}{lane[:1].upper()}{lane[1:]}": f"{queue}-{lane}" for lane in fast_lanes()
            for setting, queue in work}


def bicep_literal(expr: str) -> str | None:
    """'text' -> text; None for any other expression."""
    m = re.fullmatch(r"'([^'$]*)'", expr.strip())
    return m.group(1) if m else None


def bicep_string_array(text: str, var: str) -> list[str]:
    m = re.search(rf"^var {var} = \[\n(?P<body>.*?)^\]", text, re.S | re.M)
    assert m, f"var {var} = [...] not found"
    return re.findall(r"^\s*'([^']*)'\s*$", m.group("body"), re.M)


def queue_config() -> dict:
    return json.loads(QUEUE_CONFIG.read_text())


def declared_queues() -> dict[str, dict]:
    """The queues infra/servicebus-config.json declares."""
    namespaces = queue_config()["UserConfig"]["Namespaces"]
    assert len(namespaces) == 1, "infra/main.bicep deploys the first namespace of servicebus-config.json only"
    return {q["Name"]: q["Properties"] for q in namespaces[0]["Queues"]}


def config_queues() -> dict[str, dict]:
    """Every queue of the namespace: the declared ones and the priority lanes' copies the local
    emulator is given (local/queueconfig.py, shared.core.workflows.lanes.with_lane_queues)."""
    from shared.core.workflows.lanes import with_lane_queues

    namespaces = with_lane_queues(queue_config())["UserConfig"]["Namespaces"]
    return {q["Name"]: q["Properties"] for q in namespaces[0]["Queues"]}
