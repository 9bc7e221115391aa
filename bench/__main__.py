"""``python -m bench`` (``make bench``): the whole benchmark in one run; see bench/run.py."""

import sys

from bench.run import main

sys.exit(main())
