"""The pure core: decisions over typed rows, with no I/O, no SDK and no telemetry.

* ``statemachine``: the order's state machine, (rows, event, now) -> a decision and its effects;
* ``workflows``: the workflows, agents and lanes, declared in workflows/*;
* ``breaker``: a remote's circuit breaker, its watch, and the steps that wait on it;
* ``effects``: what a decision asks for; ``messages``: the messages between the roles;
* ``orders``: the public order contract; ``jsonio``: strict JSON with Decimals; ``sealed``: MAC'd tokens.

import-linter (pyproject.toml) checks that nothing here imports outside ``shared.core``.
"""
