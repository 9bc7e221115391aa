"""``python -m bench.peer_dbos`` (with .venv-peer's python): the peer's process; see server.py."""

import sys

from bench.peer_dbos.server import main

sys.exit(main())
