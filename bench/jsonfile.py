"""A benchmark's result document, written where it was asked for (its folder made), and said so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: str | Path, doc: Any) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return out
