"""``python -m bench.peer_temporal`` (with .venv-temporal's python): the worker and HTTP front; see server.py."""

import sys

from bench.peer_temporal.server import main

sys.exit(main())
