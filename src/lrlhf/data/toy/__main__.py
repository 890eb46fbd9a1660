"""``python -m lrlhf.data.toy describe [--seed N]`` | ``build OUT_DIR [--seed N]``."""

from __future__ import annotations

import argparse
import sys

from .world import WorldConfig, build_world, describe


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lrlhf.data.toy", description="The lrlhf toy world.")
    commands = parser.add_subparsers(dest="command", required=True)
    describe_cmd = commands.add_parser("describe", help="print the yardsticks of the world")
    describe_cmd.add_argument("--seed", type=int, default=0)
    build_cmd = commands.add_parser("build", help="write tokenizer, model, data files and world.json")
    build_cmd.add_argument("out_dir")
    build_cmd.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "describe":
        print(describe(WorldConfig(seed=args.seed)))
    else:
        paths = build_world(args.out_dir, seed=args.seed)
        print(f"toy world (seed {args.seed}) written to {paths.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
