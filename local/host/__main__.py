"""``python -m local.host --app-dir DIR --settings FILE [--instances N] [--host H] [--port P] [--set N=V ...]``"""

import sys

from .supervisor import main

sys.exit(main())
