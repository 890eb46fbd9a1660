"""Where prefix sharing pays: an RM training step (forward + backward) padded against prefix-shared, by prefix share.

    python bench/prefix_share_sweep.py [--pairs 16] [--length 256] [--repeats 5] [--threads 1]

For each prompt fraction ``f`` of ``--length`` tokens, ``--pairs`` pairs share a prompt of ``f * length`` tokens
and have completions of ``(1 - f) * length`` tokens (+-25%, so a batch is padded as a real one is); the same
batch is scored by ``RewardModule.score`` and back-propagated through ``compute_loss`` in both layouts
(``collate_pairs`` / ``collate_shared_pairs``), alternating, on bench/rm_vs_trl.py's reference Llama (random
init, fp32, sdpa). Prints the measured prefix share (:func:`lrlhf.data.shared_batches.prefix_share`) and the median
times; ``data.prefix_sharing=auto``'s threshold (``AUTO_MIN_SHARE``) comes from this table (bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rm_vs_trl import PAD, build_model


def pairs_with_share(n: int, length: int, fraction: float, seed: int):
    from lrlhf.data.tokenize import Encoded, EncodedPair

    g = torch.Generator().manual_seed(seed)
    prompt_length = max(1, round(fraction * length))
    out = []
    for _ in range(n):
        prompt = torch.randint(2, 8000, (prompt_length,), generator=g)
        sides = []
        for _ in range(2):
            answer = max(1, round((1 - fraction) * length * float(0.75 + 0.5 * torch.rand(1, generator=g))))
            ids = torch.cat([prompt, torch.randint(2, 8000, (answer,), generator=g)])
            sides.append(Encoded(ids, torch.ones_like(ids), torch.arange(len(ids)) >= prompt_length, prompt_length))
        out.append(EncodedPair(sides[0], sides[1], 1.0))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fractions", default="0.05,0.1,0.2,0.3,0.5,0.7,0.9")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from lrlhf.data.collate import collate_pairs
    from lrlhf.data.shared_batches import AUTO_MIN_SHARE, collate_shared_pairs, prefix_share
    from lrlhf.models import ModelConfig
    from lrlhf.modules import RewardConfig, RewardModule

    with tempfile.TemporaryDirectory() as tmp:
        build_model(Path(tmp) / "model", 0)
        module = RewardModule(ModelConfig(str(Path(tmp) / "model")), RewardConfig())
    print(f"torch threads: {torch.get_num_threads()}; torch {torch.__version__}; reference Llama (h256 L4, "
          f"vocab 8000), fp32, full fine-tuning; {args.pairs} pairs of ~{args.length} tokens; median of {args.repeats} "
          f"alternating steps (forward + backward) after one warm-up")
    print()
    print("| prompt fraction | measured prefix share | padded ms | shared ms | shared / padded |")
    print("|---|---|---|---|---|")
    for fraction in (float(f) for f in args.fractions.split(",")):
        pairs = pairs_with_share(args.pairs, args.length, fraction, seed=0)
        batches = {"padded": collate_pairs(pairs, PAD), "shared": collate_shared_pairs(pairs, PAD)}
        times = {name: [] for name in batches}
        for repeat in range(args.repeats + 1):
            for name, batch in batches.items():
                module.zero_grad()
                start = time.perf_counter()
                module.compute_loss(module.score(batch), batch).loss.backward()
                if repeat:
                    times[name].append(time.perf_counter() - start)
        padded, shared = (1e3 * statistics.median(times[k]) for k in ("padded", "shared"))
        print(f"| {fraction:.2f} | {prefix_share(pairs):.3f} | {padded:.0f} | {shared:.0f} | {shared / padded:.2f} |")
    print()
    print(f"data.prefix_sharing=auto shares at a prefix share >= {AUTO_MIN_SHARE}")


if __name__ == "__main__":
    main()
