"""The app's functions as the worker indexes them, read once per test process: ``FunctionApp.
get_functions()`` may be called only once per app (a second call raises on every name)."""

from __future__ import annotations

import functools
import json
import os
from typing import Any
from unittest import mock

from tests.unit.harness import REQUIRED_VALUES


@functools.cache
def indexed_functions() -> dict[str, dict[str, Any]]:
    """Function name -> its function.json, from ``import function_app`` with the required settings."""
    with mock.patch.dict(os.environ, REQUIRED_VALUES):
        import function_app

    return {f.get_function_name(): json.loads(f.get_function_json()) for f in function_app.app.get_functions()}
