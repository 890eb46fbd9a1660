"""What the plan line adds about the stage cache: a stage about to be built that the cache holds with other
``threads`` (:func:`threads_hints`)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from lrlhf.run.planning import keyed_content
from lrlhf.utils.state import flatten


def threads_hints(todo: list) -> list[str]:
    """For each stage about to be built whose cache holds a finished stage of the same recipe that differs from it
    only in ``threads`` (and in the paths of the stages each reads, which differ for the same reason), one line
    saying so: ``threads`` is part of a stage's key (float sums differ with it), so a launch with another
    ``threads=`` rebuilds every stage, which the plan line alone calls "building"."""
    hints = []
    for recipe, dep, out_dir in todo:
        mine = None
        for other in sorted(Path(out_dir).parent.glob(f"{recipe}-*")):
            if other == Path(out_dir) or not all((other / f).is_file() for f in ("summary.json", "config.yaml")):
                continue
            if mine is None:
                mine = flatten(keyed_content(OmegaConf.to_container(dep, resolve=True)))
            try:
                theirs = flatten(keyed_content(OmegaConf.to_container(OmegaConf.load(other / "config.yaml")) or {}))
            except Exception:  # an unreadable entry is no hint
                continue
            differ = {k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k) and not (
                isinstance(mine.get(k), str) and isinstance(theirs.get(k), str)
                and "/stages/" in mine[k] + theirs[k])}  # a path into the cache: its stage's own key
            if differ == {"threads"}:
                hints.append(f"note: the cache holds a `{recipe}` stage with these settings built with "
                             f"threads={theirs['threads']} ({other}); threads is part of a stage's key (float sums "
                             f"differ), so this launch (threads={mine['threads']}) builds it again: launch with "
                             f"threads={theirs['threads']} to reuse it")
                break
    return hints


__all__ = ["threads_hints"]
