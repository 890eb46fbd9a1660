"""The mutation score of the invariant-bearing code: every mutant mutmut makes of the files ``[tool.mutmut]`` names
in pyproject.toml (functional/, the reward rules, constraint checks, the LLM judge's parsing, mixtures, the labelling
store, the advantage estimators), each run against the selected tests that reach it.

``pip install -e '.[mutation]' && python bench/mutation.py [--keep]``   (from the checkout's root)

Prints the counts (killed, survived, reached by no test, timed out), the score and every mutant not killed with its
diff. The score is killed / (all mutants - the equivalents), where an **equivalent** is a mutant listed in
bench/mutation_equivalents.txt (``<mutant name>  <the mutated line as mutmut shows it>  # <category>: <why it cannot
change a result>``; categories ``equivalent``, no input gives another result, and ``message text``, only the words
of a message to a person change): a listed mutant whose line no longer matches is reported as stale and counted as
not killed. A mutant no selected test reaches counts as not killed. The score is also printed with the ``message
text`` ones counted as not killed. Exit status 1 below ``--target`` (default 0.95).

mutmut works in ``mutants/`` (a copy of the checkout, ignored by git); ``--keep`` keeps its earlier results (mutmut
re-tests only what changed), otherwise the folder is removed first.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENTS = ROOT / "bench" / "mutation_equivalents.txt"
CATEGORIES = ("equivalent", "message text")
#: ``<name>  <mutated line, which may hold a # comment>  # <category>: <why>``
LINE = re.compile(rf"^(\S+)\s+(.*?)\s+#\s*({'|'.join(CATEGORIES)}):\s*(.+)$")


def mutmut(*args: str, capture: bool = True) -> str:
    exe = shutil.which("mutmut") or str(Path(sys.executable).with_name("mutmut"))
    out = subprocess.run([exe, *args], cwd=ROOT, capture_output=capture, text=True)
    if out.returncode != 0:
        raise SystemExit(f"mutmut {' '.join(args)} failed ({out.returncode}):\n{(out.stdout or '')[-2000:]}"
                         f"{(out.stderr or '')[-2000:]}")
    return out.stdout or ""


def mutated_line(diff: str) -> str:
    """The first added line of a mutant's diff (what the equivalents' list records)."""
    for line in diff.splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            return line[1:].strip()
    return ""


def equivalents() -> dict[str, tuple[str, str, str]]:
    """``{mutant name: (mutated line, category, why)}`` from bench/mutation_equivalents.txt (``#``: comments)."""
    out = {}
    if EQUIVALENTS.is_file():
        for number, line in enumerate(EQUIVALENTS.read_text().splitlines(), 1):
            if not line.strip() or line.startswith("#"):
                continue
            match = LINE.match(line)
            if match is None:
                raise SystemExit(f"{EQUIVALENTS}:{number}: expected '<mutant>  <mutated line>  # <category>: why', "
                                 f"a category of {CATEGORIES}")
            out[match[1]] = (match[2], match[3], match[4])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", action="store_true", help="keep mutants/ and re-test only what changed")
    parser.add_argument("--target", type=float, default=0.95)
    args = parser.parse_args()
    if not args.keep:
        shutil.rmtree(ROOT / "mutants", ignore_errors=True)
    print("mutmut run (mutants/ in the checkout) ...", flush=True)
    mutmut("run")
    mutmut("export-cicd-stats")
    stats = json.loads((ROOT / "mutants" / "mutmut-cicd-stats.json").read_text())
    listed = equivalents()
    not_killed = []
    for line in mutmut("results").splitlines():  # "    <name>: <status>" for every mutant not killed
        if ":" in line:
            name, status = (part.strip() for part in line.rsplit(":", 1))
            not_killed.append((name, status))
    equivalent, stale, open_ = [], [], []
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:  # one process per `mutmut show`
        diffs = list(pool.map(lambda item: mutmut("show", item[0]), not_killed))
    for (name, status), diff in zip(not_killed, diffs, strict=True):
        if name in listed:
            (equivalent if listed[name][0] == mutated_line(diff) else stale).append((name, status, diff))
        else:
            open_.append((name, status, diff))
    total = stats["total"]
    denominator = total - len(equivalent)
    score = stats["killed"] / denominator if denominator else float("nan")
    categories = dict(Counter(listed[name][1] for name, _, _ in equivalent))
    for (name, status, diff), note in [(m, "") for m in open_] + [(m, " (listed as equivalent: its line changed)")
                                                                   for m in stale]:
        print(f"\n=== {name}: {status}{note}")
        print("\n".join(line for line in diff.splitlines() if line.startswith(("+", "-")) and
                        not line.startswith(("+++", "---"))))
    print(f"\nmutants {total}: killed {stats['killed']}, survived {stats['survived']}, reached by no selected test "
          f"{stats['no_tests']}, timed out {stats['timeout']}, suspicious {stats['suspicious']}; "
          f"equivalent (bench/mutation_equivalents.txt) {len(equivalent)} {categories}, listed but stale {len(stale)}")
    print(f"mutation score: {stats['killed']} / {denominator} = {score:.4f} (target {args.target})")
    strict = total - len(equivalent) + categories.get("message text", 0)
    print(f"counting message-text mutants as not killed: {stats['killed']} / {strict} = "
          f"{stats['killed'] / strict if strict else float('nan'):.4f}")
    return 0 if score >= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
