"""The bench's plots: matplotlib without a display, and a drawn figure saved and closed."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display), imported only once a plot is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path, **kw: Any) -> str:
    """Lay ``fig`` out, write it to ``path`` (its folder made) and close it."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, **kw)
    pyplot().close(fig)
    return str(path)
