"""``python -m local.remotes --host 127.0.0.1 --port P [--seed N] [--verbose]``.

Prints ``remotes ready http://HOST:PORT seed=N`` once it serves; stops on SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys

from local.procs import serve_until_signalled
from local.remotes.server import RemotesServer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m local.remotes", description=__doc__)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0: any free port (printed on the ready line)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fault injection's random draws")
    ap.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = ap.parse_args(argv)

    server = RemotesServer(args.host, args.port, seed=args.seed, verbose=args.verbose)
    serve_until_signalled(server, f"remotes ready {server.url} seed={args.seed}")
    print("remotes stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
