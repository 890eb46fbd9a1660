"""``lrlhf label <file> [--checks FILE] [--budget N] [--out DIR] [--host H] [--port P] [--token T] [--format F]
[--instructions FILE] [--export OUT]``: serve the labelling page (or, with ``--export``, write the labelled pairs).

The page is served on 127.0.0.1 by default; another host needs a token (``--token``, at least 16 characters, or
one is drawn and printed in the page's address). The command prints the address, serves until Ctrl-C (or until the
budget is labelled with ``--exit-when-done``) and names the labelled file.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from pathlib import Path

from lrlhf.labelling.store import LabelStore


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lrlhf", description="lrlhf's labelling page (lrlhf --help: every verb)")
    commands = p.add_subparsers(dest="command", required=True)
    label = commands.add_parser("label", help="serve the preference-labelling page for a to-label file")
    label.add_argument("file", help="pairs in the preference format (prompt, chosen, rejected), e.g. "
                                    "<run>/labelling/round_2.to_label.jsonl")
    label.add_argument("--checks", help="check items with a known answer (`chosen` is the better one), mixed in")
    label.add_argument("--budget", type=int, help="write the labelled file once this many pairs have a decision "
                                                  "other than skip (default: all)")
    label.add_argument("--out", help="the folder of the labels and the labelled file (default: the file's folder)")
    label.add_argument("--host", default="127.0.0.1")
    label.add_argument("--port", type=int, default=8765, help="0: any free port")
    label.add_argument("--token", help="required of every request, at least 16 characters (drawn when --host is not "
                                       "a loopback address)")
    label.add_argument("--seed", type=int, default=0, help="the order of the answers and of the checks")
    label.add_argument("--format", default="auto", help="the file's preference format (default: detected from its "
                                                        "first record; e.g. pairwise, hh_rlhf, sharegpt_pairwise)")
    label.add_argument("--instructions", help="a text file of labelling guidelines, shown above every pair")
    label.add_argument("--export", metavar="OUT", help="write the labelled pairs only (no unlabelled, skipped or "
                                                       "both-bad pair) from the labels given so far to OUT, and exit")
    label.add_argument("--exit-when-done", action="store_true", help="stop once the budget is labelled")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        store = LabelStore(args.file, checks=args.checks, budget=args.budget, seed=args.seed, out_dir=args.out,
                           format=args.format)
        instructions = Path(args.instructions).read_text(encoding="utf-8") if args.instructions else None
    except (ValueError, OSError) as err:
        print(f"lrlhf label: {err}", file=sys.stderr)
        return 2
    dropped = "".join(f"; {n} dropped ({reason})" for reason, n in store.dropped.items())
    if args.export:
        n = store.export(args.export)
        print(f"lrlhf label: {n} labelled pairs of {len(store.pairs)}{dropped} written to {args.export}", flush=True)
        return 0
    try:
        from lrlhf.labelling.app import LOOPBACK, Server, need_web

        need_web()
    except ImportError as err:
        print(f"lrlhf label: {err}", file=sys.stderr)
        return 2
    token = args.token or (None if args.host in LOOPBACK else secrets.token_urlsafe(16))
    try:
        server = Server(store, args.host, args.port, token, instructions=instructions)
    except (ValueError, OSError) as err:
        print(f"lrlhf label: {err}", file=sys.stderr)
        return 2
    print(f"lrlhf label: {len(store.pairs)} pairs of {store.path}{dropped}; labels per annotator in "
          f"{store.log_dir}/; the labelled file {store.out} once {store.budget} have a decision", flush=True)
    print(f"lrlhf label: serving at {server.url}", flush=True)
    try:
        if args.exit_when_done:
            server.start()
            store.complete.wait()
            server.stop()
        else:
            server.serve_forever()
    except KeyboardInterrupt:
        server.stop()
    done = f"the labelled file is {store.out}" if store.complete.is_set() else "the budget is not labelled yet"
    print(f"lrlhf label: stopped; {done}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
