"""Build an OpenAssistant-style rankings file (``{prompt, completions, ranks, group}``, one conversation tree per
group) from the HH-RLHF harmless test split in ../shared/data, to try ``world=files`` with rankings as a user would
(#36): every multi-turn transcript gives two records of one tree, its first turn (the transcript's own first answer
ranked above a curt refusal) and its last turn (chosen above rejected, three answers with a curt one last). The
first turn's best answer appears verbatim inside the last turn's prompt, as in OpenAssistant's trees.

    python bench/oasst_style_rankings.py --out /tmp/rankings.jsonl [--limit 600]
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT.parent / "shared" / "data" / "hh-rlhf" / "harmless-base" / "test.jsonl.gz"
CURT = "I can't help with that."


def turns(transcript: str) -> list[dict]:
    out = []
    for chunk in transcript.split("\n\nHuman: ")[1:]:
        human, _, rest = chunk.partition("\n\nAssistant: ")
        out.append({"role": "user", "content": human.strip()})
        for j, answer in enumerate(rest.split("\n\nAssistant: ")):
            if answer.strip() or j == 0:
                out.append({"role": "assistant", "content": answer.strip()})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=600, help="transcripts read (multi-turn ones give two records)")
    args = parser.parse_args()
    rows, trees = [], 0
    with gzip.open(SOURCE, "rt") as f:
        for i, line in enumerate(f):
            if i >= args.limit:
                break
            pair = json.loads(line)
            chosen, rejected = turns(pair["chosen"]), turns(pair["rejected"])
            if chosen[:-1] != rejected[:-1] or not chosen or chosen[-1]["role"] != "assistant":
                continue
            prompt, group = chosen[:-1], f"hh-test-{i}"
            answers = [chosen[-1]["content"], rejected[-1]["content"], CURT]
            if len(set(answers)) < 3 or not all(answers):
                continue
            rows.append({"prompt": prompt, "completions": answers, "ranks": [1, 2, 3], "group": group})
            if len(prompt) >= 3 and prompt[1]["content"] and prompt[1]["content"] != CURT:
                rows.append({"prompt": prompt[:1], "completions": [prompt[1]["content"], CURT], "ranks": [1, 2],
                             "group": group})
                trees += 1
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{args.out}: {len(rows)} rankings in {len({r['group'] for r in rows})} groups ({trees} with two turns)")


if __name__ == "__main__":
    main()
