"""The rollout sampler's throughput alone: ``python bench/compare_trl.py --sampling [--device cuda --shape qwen05
--precision bf16-mixed --batch 64 --new 128] [--decoding eager,static,compiled]`` (the options and the model/prompt
builders are compare_trl.py's). Each decoding of the comma list is timed on the same module and prompts, from the
same seed; the first call of ``compiled`` includes its compilation, reported apart with the rollouts after which
it pays off against eager.

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
from compare_trl import ours_parts, peak_cuda_gib, report_header, setting, sync_fn
from shapes import SHAPES, build_model, make_prompts

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
    from lrlhf.models.decoding import COMPILE_SECONDS

    report_header(args)
    print(setting(args))
    print(f"prompt columns {query_ids.shape[1]} (left-padded)")
    print()
    print("| decoding | first call s (compile included) | compile s | median s per call | tokens/s | ms per step "
          "| sampled columns |")
    print("|---|---|---|---|---|---|---|")
    results = {}
    for decoding in args.decoding.split(","):
        module.config.decoding = decoding
        COMPILE_SECONDS.clear()
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
        compile_s = sum(COMPILE_SECONDS.values())
        print(f"| {decoding} | {seconds[0]:.2f} | {compile_s:.1f} | {median:.3f} | {rate:,.0f} | "
              f"{1000 * median / max(timed_cols):.1f} | {timed_cols} |")
        results[decoding] = {"median_s": median, "tokens_per_s": rate, "columns": columns, "all_s": seconds,
                             "first_s": seconds[0], "compile_s": compile_s,
                             "mean_length": statistics.mean(lengths[args.warmup:])}
    eager = results.get("eager")
    for decoding, r in results.items():
        if eager is None or decoding == "eager":
            continue
        gain = eager["median_s"] - r["median_s"]
        if not r["compile_s"]:
            payoff = "no compilation"
        elif gain > 0:
            payoff = f"compile {r['compile_s']:.1f} s, paid off after {-(-r['compile_s'] // gain):.0f} rollouts"
        else:
            payoff = f"compile {r['compile_s']:.1f} s, never paid off (not faster per rollout)"
        print(f"{decoding}: {eager['median_s'] / r['median_s']:.2f}x eager's speed per rollout; {payoff}")
    if "generate" in args.peers:
        results["hf_generate"] = hf_generate(module, query_ids, query_mask, args, autocast, sync)
    peak = peak_cuda_gib(args.device)
    if peak is not None:
        print(f"process peak CUDA memory: {peak:.1f} GiB")
    first = next(iter(results.values()))
    return {"mode": "sampling", "median_s": first["median_s"], "tokens_per_s": first["tokens_per_s"],
            "columns": first["columns"], "all_s": first["all_s"], "rows": int(query_ids.shape[0]),
            "prompt_columns": int(query_ids.shape[1]), "mean_length": first["mean_length"], "peak_cuda_gib": peak,
            "decodings": results}


def hf_generate(module, query_ids, query_mask, args, autocast, sync) -> dict:
    """The peer on the same batch: plain transformers ``generate`` on the same peft model (the policy adapter on),
    sampling at T = 1 (top-k 0, top-p 1) with ``--new`` tokens forced (``min_new_tokens``), no log-probs asked;
    its per-decode-step time beside ours (``--peers generate``)."""
    model = module.model
    module.use_adapter("policy")
    kwargs = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=args.new,
                  min_new_tokens=args.new, pad_token_id=module.pad_token_id)
    torch.manual_seed(args.seed)
    seconds = []
    for _ in range(args.warmup + args.iters):
        sync()
        start = time.perf_counter()
        with torch.no_grad(), autocast:
            out = model.generate(input_ids=query_ids, attention_mask=query_mask, **kwargs)
        sync()
        seconds.append(time.perf_counter() - start)
    columns = out.shape[1] - query_ids.shape[1]
    median = statistics.median(seconds[args.warmup:])
    rate = query_ids.shape[0] * columns / median
    print(f"| transformers generate (peer) | {seconds[0]:.2f} | - | {median:.3f} | {rate:,.0f} | "
          f"{1000 * median / columns:.1f} | {[columns] * args.iters} |")
    return {"median_s": median, "tokens_per_s": rate, "columns": [columns] * len(seconds), "all_s": seconds,
            "first_s": seconds[0], "compile_s": 0.0, "mean_length": float(columns)}
