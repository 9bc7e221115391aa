"""The "ci" profile `make test` loads (tests/conftest.py) changes no example count."""

from __future__ import annotations

from hypothesis import settings


def test_the_ci_profile_keeps_the_example_counts_and_drops_the_deadline() -> None:
    ci, default = settings.get_profile("ci"), settings.get_profile("default")
    assert ci.max_examples == default.max_examples
    assert ci.stateful_step_count == default.stateful_step_count
    assert ci.deadline is None and ci.database is None and ci.print_blob
