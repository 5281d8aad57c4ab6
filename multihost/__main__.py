"""`python -m multihost up a b c` : make hosts a, b, c (network namespaces on a private bridge) and keep
them until Ctrl-C, printing how to run a command on each; `python -m multihost sweep`: remove hosts left
by a harness whose owner died (`--all`: every jetrl test host). Needs root."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from multihost.netns import HostNet, NetnsUnavailable, sweep


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m multihost")
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="make hosts and keep them until Ctrl-C")
    up.add_argument("hosts", nargs="+", help="host names (1-12 lower-case letters or digits)")
    sw = sub.add_parser("sweep", help="remove leftover test hosts")
    sw.add_argument("--all", action="store_true", help="also those of a live owner")
    args = p.parse_args(argv)
    if args.cmd == "sweep":
        for name in sweep(only_dead=not args.all):
            print(f"removed {name}")
        return 0
    try:
        net = HostNet(args.hosts).create()
    except (NetnsUnavailable, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        print(net.describe())
        print("Ctrl-C removes them (and kills what runs on them)", flush=True)
        while not done.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        net.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
