"""``lrlhf VERB ...``: the installed command, one verb per job (after litgpt's table of verbs).

``lrlhf train [recipe=NAME] [key=value ...]`` is ``python train.py ...`` (:func:`lrlhf.run.cli.main`): a recipe and
Hydra overrides. ``lrlhf eval [key=value ...]`` is ``lrlhf train recipe=eval ...``. ``lrlhf label FILE [...]`` serves
the labelling page (:mod:`lrlhf.labelling.command`). The configs and recipes ship in the package, so the command
works from any folder after ``pip install lrlhf``; a folder of the user's own configs composes over them with
Hydra's search path (``hydra.searchpath=[file:///path/to/my_configs]``, docs/extending.md).
"""

from __future__ import annotations

import sys

#: verb -> (what it does, how it is called)
VERBS = {
    "train": ("run a recipe: its missing stages first, then its own", "lrlhf train recipe=ppo_lora [key=value ...]"),
    "eval": ("evaluate policies side by side (recipe=eval)", "lrlhf eval [eval.policies=...] [key=value ...]"),
    "label": ("serve the preference-labelling page for a file", "lrlhf label FILE [--budget N] [--out DIR] ..."),
}


def usage() -> str:
    width = max(len(verb) for verb in VERBS)
    rows = [f"  {verb:<{width}}  {what}\n  {'':<{width}}  {how}" for verb, (what, how) in VERBS.items()]
    return ("usage: lrlhf VERB [arguments]\n\nverbs:\n" + "\n".join(rows)
            + "\n\n`lrlhf train --help` lists the recipes and config groups; `lrlhf label --help` the page's options.")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    verb, rest = args[0], args[1:]
    if verb == "label":
        from lrlhf.labelling.command import main as label

        return label(["label", *rest])
    if verb in ("train", "eval"):
        from lrlhf.run.cli import main as train

        if verb == "eval":
            if any(a.lstrip("+").startswith("recipe=") for a in rest):
                print("lrlhf eval: it runs recipe=eval; another recipe is `lrlhf train recipe=NAME`", file=sys.stderr)
                return 2
            rest = ["recipe=eval", *rest]
        train(rest, prog=f"lrlhf {verb}")
        return 0
    print(f"lrlhf: unknown verb {verb!r}\n\n{usage()}", file=sys.stderr)
    return 2


__all__ = ["VERBS", "main", "usage"]
