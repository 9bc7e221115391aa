"""Publish readiness: what `func azure functionapp publish` ships starts and indexes.

The package is built the way publish builds it: every file of the app root that .funcignore
(gitignore syntax) does not exclude. requirements.txt is installed into a venv of its own (the
remote build does the same), the package is unpacked into a temporary directory, and
function_app is imported there by that venv's Python, as the Python worker does; then the
indexed functions and their bindings are checked against shared/settings.py and
shared/core/workflows/__init__.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import zipfile
from collections import Counter
from pathlib import Path

import pathspec
import pytest

from shared.core.workflows.catalog import AGENTS
from shared.settings import QUEUE_SETTINGS, SETTING_NAMES, SETTINGS, TOKEN_KEYS, new_token_key

from .conftest import REPO_ROOT, VENV_TIMEOUT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(VENV_TIMEOUT)]

FUNCIGNORE = REPO_ROOT / ".funcignore"

# Never shipped: tests, the local stack, infrastructure, benchmarks, docs, tool state, secrets.
EXCLUDED_DIRS = ["tests/", "local/", "infra/", "bench/", "docs/", "node_modules/", ".venv/", ".venv-checkov/",
                 ".venv-publish/", ".local/", ".git/", ".ci/", "__pycache__/", "shared/__pycache__/"]
EXCLUDED_FILES = ["local.settings.json", "local.settings.json.example", "Makefile", "package.json",
                  "package-lock.json", "pyproject.toml", "requirements-dev.txt", "README.md", ".gitignore",
                  "shared/__pycache__/settings.cpython-311.pyc"]
SHIPPED = ["function_app.py", "host.json", "requirements.txt", "shared/__init__.py", "shared/settings.py",
           "shared/core/workflows/__init__.py", "shared/core/workflows/catalog.py", "functions/__init__.py",
           "shared/core/workflows/__init__.py", "workflows/agents.json", "workflows/order.v1.yaml",
           "workflows/digital.v1.yaml"]  # the app reads the agents and workflows from workflows/ at start-up

# Settings in the form Azure has them (infra/modules/functionapp.bicep): identity-based only.
IDENTITY_ENV = {
    "AzureWebJobsStorage__accountName": "stexample",
    "AzureWebJobsStorage__credential": "managedidentity",
    "AzureWebJobsStorage__clientId": "00000000-0000-0000-0000-000000000001",
    "ServiceBusConnection__fullyQualifiedNamespace": "sb-example.servicebus.windows.net",
    "ServiceBusConnection__credential": "managedidentity",
    "ServiceBusConnection__clientId": "00000000-0000-0000-0000-000000000001",
    "StateStorage__tableServiceUri": "https://stexample.table.core.windows.net/",
    "StateStorage__credential": "managedidentity",
    "StateStorage__clientId": "00000000-0000-0000-0000-000000000001",
}

# What the Python worker does with the app root: import the script, find its one FunctionApp
# (a FunctionRegister), and read the functions it indexes.
INDEX_SCRIPT = r"""
import importlib, json, sys
root = sys.argv[1]
sys.path.insert(0, root)
import azure.functions as func
module = importlib.import_module("function_app")
apps = [getattr(module, n) for n in dir(module) if isinstance(getattr(module, n), func.FunctionRegister)]
if len(apps) != 1:
    raise SystemExit(f"expected exactly one FunctionApp in function_app.py, found {len(apps)}")
functions = [{"name": f.get_function_name(), "bindings": json.loads(f.get_function_json())["bindings"]}
             for f in apps[0].get_functions()]
files = {name: getattr(m, "__file__", None) for name, m in list(sys.modules.items())
         if name.split(".")[0] in ("function_app", "shared", "functions", "local", "tests", "bench")}
print(json.dumps({"functions": functions, "modules": files}))
"""


def funcignore() -> pathspec.PathSpec:
    return pathspec.GitIgnoreSpec.from_lines(FUNCIGNORE.read_text().splitlines())


def package_files(root: Path) -> list[str]:
    """Every file under root that .funcignore does not exclude (posix paths, relative)."""
    spec = funcignore()
    files: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = sorted(d for d in dirnames if not spec.match_file(prefix + d + "/"))
        files += [prefix + f for f in sorted(filenames) if not spec.match_file(prefix + f)]
    return files


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The zip publish would upload, built from the repository."""
    assert (REPO_ROOT / "function_app.py").exists(), "function_app.py is missing"
    archive = tmp_path_factory.mktemp("publish") / "app.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for rel in package_files(REPO_ROOT):
            zf.write(REPO_ROOT / rel, rel)
    return archive


@pytest.fixture(scope="module")
def unpacked(package: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wwwroot")
    with zipfile.ZipFile(package) as zf:
        zf.extractall(root)
    return root


@pytest.fixture(scope="module")
def indexed(unpacked: Path, publish_python: Path) -> dict:
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", str(unpacked)), **IDENTITY_ENV}
    env.update({s.name: s.default for s in SETTINGS if s.kind != "connection" and s.default is not None})
    env.update({s.name: f"https://{s.name.lower()}.example" for s in SETTINGS if s.required and s.kind == "value"})
    env[TOKEN_KEYS] = new_token_key()  # what the Key Vault reference resolves to in Azure
    proc = subprocess.run([str(publish_python), "-I", "-c", INDEX_SCRIPT, str(unpacked)], cwd=unpacked, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"function_app does not import from the package:\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_funcignore_excludes_what_is_never_shipped() -> None:
    spec = funcignore()
    for path in EXCLUDED_DIRS + [d + "x.py" for d in EXCLUDED_DIRS] + EXCLUDED_FILES:
        assert spec.match_file(path), f".funcignore ships {path}"
    for path in SHIPPED + ["functions/agents.py", "shared/runtime/clients.py"]:
        assert not spec.match_file(path), f".funcignore leaves out {path}"


def test_package_holds_the_app_and_nothing_else(package: Path) -> None:
    names = zipfile.ZipFile(package).namelist()
    for path in SHIPPED:
        assert path in names, f"{path} is not in the package"
    for name in names:
        assert not any(name.startswith(d) for d in EXCLUDED_DIRS), f"{name} is in the package"
        assert name not in EXCLUDED_FILES, f"{name} is in the package"
        assert "__pycache__" not in name and not name.endswith(".pyc")
    top = {n.split("/")[0] for n in names}
    assert top <= {"function_app.py", "host.json", "requirements.txt", "shared", "functions", "workflows"}, top


def test_function_app_imports_from_the_package_alone(indexed: dict, unpacked: Path) -> None:
    for name, file in indexed["modules"].items():
        assert name.split(".")[0] not in ("local", "tests", "bench"), f"the app imports {name}"
        if file:
            assert Path(file).resolve().is_relative_to(unpacked.resolve()), f"{name} came from {file}"


def _triggers(indexed: dict) -> list[tuple[str, dict]]:
    out = []
    for fn in indexed["functions"]:
        triggers = [b for b in fn["bindings"] if b["type"].endswith("Trigger")]
        assert len(triggers) == 1, f"{fn['name']} has {len(triggers)} triggers"
        out.append((fn["name"], triggers[0]))
    return out


def test_indexed_functions_have_unique_names(indexed: dict) -> None:
    names = [fn["name"] for fn in indexed["functions"]]
    assert names and len(names) == len(set(names)), names


def test_http_functions(indexed: dict) -> None:
    http = [t for _, t in _triggers(indexed) if t["type"] == "httpTrigger"]
    assert http, "no HTTP function"
    for t in http:
        assert t.get("methods"), t


def test_one_service_bus_trigger_per_agent_and_for_the_scheduler(indexed: dict) -> None:
    triggered = Counter(t["queueName"] for _, t in _triggers(indexed) if t["type"] == "serviceBusTrigger")
    for agent in AGENTS:
        assert triggered[f"%{agent.queue_setting}%"] == 1, (agent.name, triggered)
    assert triggered["%SchedulerQueue%"] >= 1, f"no scheduler trigger on %SchedulerQueue%: {triggered}"
    assert triggered["%RepliesQueue%"] >= 1, f"nothing reads the agents' replies (%RepliesQueue%): {triggered}"


def test_supervisor_and_retention_timers(indexed: dict) -> None:
    timers = [t for _, t in _triggers(indexed) if t["type"] == "timerTrigger"]
    assert sorted(t["schedule"] for t in timers) == ["%RetentionSchedule%", "%SupervisorSchedule%"], timers


def test_every_binding_reads_declared_settings(indexed: dict) -> None:
    queue_settings = {s.name for s in QUEUE_SETTINGS}
    connections = {s.name for s in SETTINGS if s.kind == "connection"}
    for fn in indexed["functions"]:
        for b in fn["bindings"]:
            if b["type"].lower().startswith("servicebus"):
                m = re.fullmatch(r"%(\w+)%", b.get("queueName", ""))
                assert m and m.group(1) in queue_settings, f"{fn['name']}: queueName {b.get('queueName')!r}"
                assert b.get("connection") == "ServiceBusConnection", f"{fn['name']}: {b}"
            if "connection" in b:
                assert b["connection"] in connections, f"{fn['name']}: connection {b['connection']!r}"
            for value in b.values():
                for name in re.findall(r"%(\w+)%", value if isinstance(value, str) else ""):
                    assert name in SETTING_NAMES, f"{fn['name']}: %{name}% is not declared in shared/settings.py"
