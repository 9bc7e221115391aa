"""The console's static files (no browser needed): the manifest lists every file, the vendored ones
are the npm package's files byte for byte (sha256), nothing comes from a CDN, and no script builds
HTML from strings (data goes in as text nodes only)."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from local.procs import REPO_ROOT

STATIC = REPO_ROOT / "functions" / "console_static"
MANIFEST = json.loads((STATIC / "manifest.json").read_text(encoding="utf-8"))["files"]
OWN = sorted(name for name, entry in MANIFEST.items() if not entry)
VENDORED = {name: entry for name, entry in MANIFEST.items() if entry}


def test_the_manifest_lists_every_file_of_the_folder_and_nothing_else() -> None:
    on_disk = {p.name for p in STATIC.iterdir() if p.is_file()} - {"manifest.json"}
    assert sorted(on_disk) == sorted(MANIFEST)
    assert not [p for p in STATIC.iterdir() if p.is_dir()], "the folder is flat: the asset route has one segment"


@pytest.mark.parametrize("name", sorted(VENDORED))
def test_vendored_files_match_their_sha256_and_the_pinned_package(name: str) -> None:
    entry = VENDORED[name]
    body = (STATIC / name).read_bytes()
    assert hashlib.sha256(body).hexdigest() == entry["sha256"]
    package = json.loads((REPO_ROOT / "package.json").read_text(encoding="utf-8"))
    assert package["devDependencies"][entry["package"]] == entry["version"], "package.json pins the vendored version"
    lock = json.loads((REPO_ROOT / "package-lock.json").read_text(encoding="utf-8"))
    assert lock["packages"][f"node_modules/{entry['package']}"]["version"] == entry["version"]
    source = REPO_ROOT / entry["from"]
    if source.exists():  # after npm ci: the very file of the package
        assert hashlib.sha256(source.read_bytes()).hexdigest() == entry["sha256"]


@pytest.mark.parametrize("name", OWN)
def test_no_cdn_and_no_html_built_from_strings(name: str) -> None:
    text = (STATIC / name).read_text(encoding="utf-8")
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", text), "every file is served by the app itself"
    assert not re.search(r"\bimport\s*\(?[^;]*[\"']https?://", text)
    if name.endswith(".js"):
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in text, f"{name} uses {sink}"
        assert "console.error" not in text and "console.log" not in text


def test_the_page_loads_only_listed_files() -> None:
    page = (STATIC / "index.html").read_text(encoding="utf-8")
    referenced = set(re.findall(r"console/assets/([^\"']+)", page))
    modules = {m for name in OWN if name.endswith(".js")
               for m in re.findall(r"from \"\./([^\"]+)\"", (STATIC / name).read_text(encoding="utf-8"))}
    assert referenced and modules
    assert referenced | modules <= set(MANIFEST)
