"""The rollout sampler's throughput alone: ``python bench/compare_trl.py --sampling [--device cuda --shape qwen05
--precision bf16-mixed --batch 64 --new 128]`` (the options and the model/prompt builders are compare_trl.py's).

``PPOModule.sample`` (:func:`lrlhf.models.generation.sample_with_logprobs` with the ``policy`` adapter on, as in a
rollout) on ``--batch`` prompts, ``--warmup`` untimed then ``--iters`` timed calls under the run's precision;
throughput = rows x sampled columns / median seconds. Run by ``bench/gpu_check.sh`` (part 3).
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
from pathlib import Path

import torch
from compare_trl import SHAPES, build_model, make_prompts, ours_parts, peak_cuda_gib, report_header, setting, sync_fn

from lrlhf.functional import response_masks


def sampling_run(args) -> dict:
    """Time ``PPOModule.sample`` (the rollout sampler, policy adapter on) on one batch of prompts."""
    sync = sync_fn(args.device)
    shape = SHAPES[args.shape]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        build_model(model_dir, shape, args.seed)
        prompts = make_prompts(args.batch, shape["vocab_size"], args.seed)
        module, data = ours_parts(model_dir, prompts, args)
        module.configure_model()  # the Trainer's hook: base + adapters
    module.to(args.device)
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    query_ids, query_mask = batch["input_ids"].to(args.device), batch["attention_mask"].to(args.device)
    autocast = (torch.autocast(args.device, dtype=torch.bfloat16) if args.precision == "bf16-mixed"
                else contextlib.nullcontext())
    torch.manual_seed(args.seed)
    seconds, columns, lengths = [], [], []
    for _ in range(args.warmup + args.iters):
        sync()
        start = time.perf_counter()
        with torch.no_grad(), autocast:
            response = module.sample(query_ids, query_mask)[0]
        sync()
        seconds.append(time.perf_counter() - start)
        columns.append(response.shape[1])
        lengths.append(float(response_masks(response, module.eos_token_ids, module.pad_token_id).lengths
                             .float().mean()))
    timed_s, timed_cols = seconds[args.warmup:], columns[args.warmup:]
    median = statistics.median(timed_s)
    rate = statistics.median(query_ids.shape[0] * c / s for c, s in zip(timed_cols, timed_s, strict=True))
    report_header(args)
    print(setting(args))
    print(f"prompt columns {query_ids.shape[1]} (left-padded), sampled columns {timed_cols}, mean response length "
          f"up to the EOS {statistics.mean(lengths[args.warmup:]):.1f}")
    print(f"sampling: median {median:.3f} s per call ({args.warmup} warm-up + {args.iters} timed), "
          f"{rate:,.0f} tokens/s (rows x sampled columns / s), {1000 * median / max(timed_cols):.1f} ms per step")
    print("all calls (s):", [round(x, 3) for x in seconds])
    peak = peak_cuda_gib(args.device)
    if peak is not None:
        print(f"process peak CUDA memory: {peak:.1f} GiB")
    return {"mode": "sampling", "median_s": median, "tokens_per_s": rate, "columns": columns, "all_s": seconds,
            "rows": int(query_ids.shape[0]), "prompt_columns": int(query_ids.shape[1]),
            "mean_length": statistics.mean(lengths[args.warmup:]), "peak_cuda_gib": peak}
