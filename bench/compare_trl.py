"""One PPO iteration: lrlhf's ``PPOModule`` against TRL's ``PPOTrainer`` (trl 1.12.0), in one run (issue #10).

    /work/venv-trl/bin/python bench/compare_trl.py [--iters 6] [--warmup 1] [--threads 1]      # time
    /work/venv-trl/bin/python bench/compare_trl.py --memory                                    # peak RSS
    python bench/compare_trl.py --device cuda --shape qwen05 --precision bf16-mixed --batch 64 --new 128 \
        --iters 3 --warmup 1 [--json out.json]                                                # one GPU
    python bench/compare_trl.py --sampling --device cuda --shape qwen05 --precision bf16-mixed --batch 64 --new 128

(``PYTHONPATH=src`` in a checkout whose package is not installed in that venv; trl is a bench-only extra.)

**Time** (the issue's reference config): a randomly initialised Llama (hidden 256, 4 layers, 4 heads,
intermediate 1024, vocab 8000, untied), saved once and loaded by both sides; a word-level tokenizer with a chat
template; 256 chat-templated prompts of 10-40 tokens (the same for both sides); 16 prompts per iteration,
64 new tokens at T = 1 (a random model almost never stops), 1 PPO epoch of 2 minibatches of 8, LoRA r=8 on
every block linear of the policy, fp32, AdamW lr 1e-5.

- ours: ``PPOModule`` in Lightning's ``Trainer.fit`` (as ``bench/ppo_step.py``): the base + ``policy`` and
  ``value`` adapters, reference = adapters off, a separate frozen reward model (``ScalarModel``) of the same size.
- TRL: ``trl.experimental.ppo.PPOTrainer`` in its own ``train`` loop, with a separate value model and reward
  model of the same size (``AutoModelForSequenceClassification``), the LoRA policy through ``peft_config``
  (reference = adapter disabled); TRL's ``gradient_checkpointing`` and ``bf16`` defaults switched off.
- An iteration = one rollout (generate, scoring, rewards, advantages) + its update epochs. Ours is timed from
  Lightning's ``on_train_batch_start`` to ``on_train_batch_end``; TRL's from one ``on_step_end`` (which its
  loop calls once per iteration) to the next (the first from ``on_train_begin``), so TRL's figure also holds
  its dataloader fetch and its ``gc.collect()``; our data loading is outside ours.
- Alternation: each loop runs in its own thread and a baton is handed over after every iteration, so exactly
  one side runs at a time and iteration i of ours is followed by iteration i of TRL's. The first ``--warmup``
  iterations of each side are dropped; medians (and quartiles) of the rest are printed, with our per-phase
  breakdown (generate, score = the rollout's no-grad forwards, update).
- Full-parameter policy: TRL's is timed with ``--full`` (reference = a frozen copy); ours is not implemented
  (``PPOConfig.policy_lora``: the reference is the adapter-free base), so only TRL's figure is printed.

**GPU and other shapes** (``--device cuda``, ``--shape``, ``--precision``; the defaults above are the CPU
reference config, unchanged): ``--shape qwen05`` is the Qwen2.5-0.5B body with a 32k vocabulary (hidden 896,
24 layers, 14 heads, 2 KV heads, intermediate 4864, vocab 32000, tied), ``--shape tiny`` a toy one for dry runs
(hidden 64, 2 layers, 4/2 heads, intermediate 128, vocab 512, tied). ``--precision bf16-mixed`` is fp32 weights
under bf16 autocast on both sides: Lightning ``precision="bf16-mixed"`` for ours, ``bf16=True`` for TRL. On CUDA
every iteration timer synchronises the device first. ``bench/gpu_check.sh`` runs the 0.5B comparison on a GPU.

**Sampling** (``--sampling``): the rollout sampler alone (``PPOModule.sample``: :func:`sample_with_logprobs` with
the ``policy`` adapter on, as in a rollout) on ``--batch`` prompts of the same set, ``--warmup`` untimed then
``--iters`` timed calls, under the same precision; throughput = rows x sampled columns / median seconds.

``--json FILE`` also writes the figures (and the versions) as JSON.

**Memory** (``--memory``): the shape of SmolLM2-135M (hidden 576, 30 layers, 9 heads, 3 KV heads, intermediate
1536, vocab 49152, tied), random weights, LoRA policy, batch 8, response 32, 2 iterations; each side runs in
a subprocess of its own (ours twice: a separate reward model as TRL has, and the reward as a LoRA adapter on
the policy's base), and its peak RSS is the child's ``ru_maxrss`` from ``os.wait4``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

import torch
from rm_vs_trl import Baton  # strict alternation of the two sides' threads (bench/ is the script's folder)
from shapes import SHAPES, SMOLLM2, build_model, make_prompts  # the shapes and their builders (bench/shapes.py)


# ------------------------------------------------------------------------------------------------ setup
def ours_parts(model_dir: Path, prompts, args, reward: str = "separate"):
    """PPOModule (LoRA policy + value adapters, frozen reward model) and its prompt datamodule."""
    from transformers import AutoTokenizer

    from lrlhf.data.datamodules import PromptDataModule
    from lrlhf.data.records import PromptExample
    from lrlhf.functional import FixedKLController
    from lrlhf.models import LoraSpec, ModelConfig, ScalarModel, load_causal_lm
    from lrlhf.models.engines import MergedEngine
    from lrlhf.modules import PPOConfig, PPOModule
    from lrlhf.modules.critic import SharedTrunk, ValueAdapter
    from lrlhf.modules.ppo import RewardAdapter

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    decoding = getattr(args, "decoding", "auto").split(",")[0]
    config = PPOConfig(max_new_tokens=args.new, temperature=1.0, ppo_epochs=1, minibatch_size=args.batch // 2,
                       forward_batch_size=args.batch, lr=1e-5, policy_lora=LoraSpec(r=8), decoding=decoding)
    critic = SharedTrunk() if getattr(args, "value_from_policy", False) else ValueAdapter(LoraSpec(r=8))
    cfg = ModelConfig(str(model_dir))
    if reward == "adapter":
        reward_model = RewardAdapter(str(model_dir.parent / "rm"))
    else:
        torch.manual_seed(args.seed + 1)
        reward_model = ScalarModel(load_causal_lm(cfg))
    engine = MergedEngine() if getattr(args, "engine", "local") == "merged" else None  # dtype auto: the run's
    module = PPOModule(load_causal_lm(cfg), reward_model, tokenizer, config, critic=critic,
                       kl_controller=FixedKLController(0.05), engine=engine)
    data = PromptDataModule(tokenizer, train=[PromptExample(p) for p in prompts], batch_size=args.batch,
                            max_length=128)
    return module, data


def trl_trainer(model_dir: Path, prompts, args, callbacks, full: bool = False):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(args.seed + 1)
    value = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype=torch.float32)
    reward = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype=torch.float32)
    ref = None
    peft_config = None
    if full:
        ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    else:
        from peft import LoraConfig

        from lrlhf.models.lora import lora_target_modules

        peft_config = LoraConfig(r=8, lora_alpha=16.0, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                                 target_modules=lora_target_modules(policy))
    ids = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False)
           for p in prompts]
    dataset = Dataset.from_dict({"input_ids": ids})
    iters = args.warmup + args.iters
    config = PPOConfig(
        output_dir=str(model_dir.parent / "trl-out"), per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=1, num_mini_batches=2, num_ppo_epochs=1, total_episodes=iters * args.batch,
        local_rollout_forward_batch_size=args.batch, response_length=args.new, temperature=1.0,
        stop_token="eos", learning_rate=1e-5, kl_coef=0.05, num_sample_generations=0,
        bf16=args.precision == "bf16-mixed", fp16=False, gradient_checkpointing=False, use_cpu=args.device == "cpu",
        report_to="none", save_strategy="no", logging_steps=1000,
        dataloader_num_workers=0, disable_tqdm=True, seed=args.seed,
    )
    return PPOTrainer(args=config, processing_class=tokenizer, model=policy, ref_model=ref, reward_model=reward,
                      train_dataset=dataset, value_model=value, callbacks=callbacks, peft_config=peft_config,
                      eval_dataset=dataset)


# ----------------------------------------------------------------------------------------------- timing
def summary(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return statistics.median(xs), q[0], q[2]


def sync_fn(device: str):
    """Waits for the device's queued work (CUDA runs asynchronously), so a timer reads finished work."""
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def time_run(args) -> dict:
    from lightning.pytorch import Callback, Trainer
    from transformers import TrainerCallback

    require_trl()
    total = args.warmup + args.iters
    baton = Baton(["ours", "trl"], timeout=900.0)
    times: dict[str, list[float]] = {"ours": [], "trl": []}
    phases: dict[str, list[float]] = {"generate": [], "score": [], "update": []}
    sync = sync_fn(args.device)

    class OurTimer(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            sync()
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            sync()
            times["ours"].append(time.perf_counter() - self.start)
            baton.hand_over("trl")
            baton.wait("ours")

    class TrlTimer(TrainerCallback):
        def on_train_begin(self, args_, state, control, **kwargs):
            baton.wait("trl")
            sync()
            self.start = time.perf_counter()

        def on_step_end(self, args_, state, control, **kwargs):
            sync()
            times["trl"].append(time.perf_counter() - self.start)
            baton.hand_over("ours")
            if len(times["trl"]) < total:
                baton.wait("trl")
            self.start = time.perf_counter()

    shape = SHAPES[args.shape]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        build_model(model_dir, shape, args.seed)
        prompts = make_prompts(max(256, total * args.batch), shape["vocab_size"], args.seed)
        module, data = ours_parts(model_dir, prompts, args)
        module = timed(module, phases, sync)
        theirs = trl_trainer(model_dir, prompts, args, [TrlTimer()], full=args.full)
        ours = Trainer(accelerator="gpu" if args.device == "cuda" else "cpu", devices=1, precision=args.precision,
                       logger=False, enable_checkpointing=False, enable_progress_bar=False,
                       enable_model_summary=False, max_epochs=-1, num_sanity_val_steps=0, limit_val_batches=0,
                       max_steps=total * module.updates_per_rollout(args.batch), callbacks=[OurTimer()])
        baton.side_by_side(lambda: ours.fit(module, datamodule=data), theirs.train)
        length = float(ours.callback_metrics["rollout/length_mean"])
        n_ours = sum(p.numel() for p in module.parameters() if p.requires_grad)
        n_trl = sum(p.numel() for p in theirs.model.parameters() if p.requires_grad)

    report_header(args)
    print(setting(args))
    print(f"trainable params: ours {n_ours:,} (policy + value adapters, value head) / TRL {n_trl:,}"
          f"{' (full policy + full value model)' if args.full else ' (policy adapter + full value model)'}")
    print(f"our last rollout: mean response length {length:.1f}")
    print(f"iterations: {args.warmup} warm-up + {args.iters} timed per side, alternating\n")
    ours_s, trl_s = summary(times["ours"][args.warmup:]), summary(times["trl"][args.warmup:])
    critic = "value head on the policy trunk" if args.value_from_policy else "value adapter"
    print("| side | median s/iteration | q1-q3 |")
    print("|---|---|---|")
    print(f"| lrlhf PPOModule (Lightning), LoRA policy, {critic} | {ours_s[0]:.3f} | {ours_s[1]:.3f}-{ours_s[2]:.3f} |")
    mode = "full-parameter policy" if args.full else "LoRA policy"
    print(f"| TRL PPOTrainer, {mode} | {trl_s[0]:.3f} | {trl_s[1]:.3f}-{trl_s[2]:.3f} |")
    print()
    print("our phases (median s):", ", ".join(
        f"{k} {statistics.median(v[args.warmup:]):.3f}" for k, v in phases.items()))
    print(f"ratio ours / TRL (medians): {ours_s[0] / trl_s[0]:.3f}  (target <= 0.5)")
    print("all iterations (s): ours", [round(x, 3) for x in times["ours"]], "TRL", [round(x, 3) for x in times["trl"]])
    medians = {k: statistics.median(v[args.warmup:]) for k, v in phases.items() if v[args.warmup:]}
    if "generate" in medians:
        print(f"our rollout sampling (generate phase): {args.batch * args.new / medians['generate']:,.0f} "
              f"tokens/s ({args.batch} rows x {args.new} new tokens; a random model rarely stops)")
    peak = peak_cuda_gib(args.device)
    if peak is not None:
        print(f"process peak CUDA memory (both sides): {peak:.1f} GiB")
    return {"mode": "time", "ours_s": list(ours_s), "trl_s": list(trl_s), "ratio": ours_s[0] / trl_s[0],
            "phases_s": medians, "our_mean_length": length, "all_s": times,
            "trainable": {"ours": n_ours, "trl": n_trl}, "peak_cuda_gib": peak}


def peak_cuda_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None


def setting(args) -> str:
    return (f"device {args.device} ({device_name(args.device)}), shape {args.shape} {SHAPES[args.shape]}, "
            f"precision {args.precision}, batch {args.batch} prompts, {args.new} new tokens")


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


def require_trl() -> None:
    """Fail at once, saying so, when TRL's PPO (or the ``datasets`` it needs) cannot be imported."""
    try:
        import datasets  # noqa: F401
        from trl.experimental.ppo import PPOTrainer  # noqa: F401
    except ImportError as err:
        raise SystemExit(f"compare_trl.py: trl is not importable, or the datasets it needs ({err!r}); the "
                         "comparison needs trl==1.12.0 and datasets (the project's `bench` extra: "
                         "pip install -e \".[bench]\", or their wheels: see bench/gpu_check.sh)") from err


def timed(module, phases, sync=lambda: None):
    """Wrap the module's phases with timers (generate, the rest of the rollout = scoring, update); ``sync``
    waits for the device before each reading (CUDA)."""
    generate, make_rollout, update = module.sample, module.make_rollout, module.update

    def timed_generate(*a, **kw):  # the rollout's sampling step (PPOModule.sample)
        if len(a) > 2 or kw.get("max_new_tokens") is not None:  # the sampler self-check's short samples
            return generate(*a, **kw)
        sync()
        t = time.perf_counter()
        out = generate(*a, **kw)
        sync()
        phases["generate"].append(time.perf_counter() - t)
        return out

    def timed_rollout(batch):
        sync()
        t = time.perf_counter()
        n = len(phases["generate"])
        out = make_rollout(batch)
        sync()
        phases["score"].append(time.perf_counter() - t - sum(phases["generate"][n:]))
        return out

    def timed_update(rollout):
        sync()
        t = time.perf_counter()
        out = update(rollout)
        sync()
        phases["update"].append(time.perf_counter() - t)
        return out

    module.sample, module.make_rollout, module.update = timed_generate, timed_rollout, timed_update
    return module


def versions() -> dict[str, str]:
    import importlib.util

    import lightning
    import peft
    import transformers

    out = {"torch": torch.__version__, "lightning": lightning.__version__, "transformers": transformers.__version__,
           "peft": peft.__version__}
    if importlib.util.find_spec("trl"):
        try:
            out["trl"] = __import__("trl").__version__
        except Exception as err:  # the sampling run does not need it
            out["trl"] = f"not importable ({type(err).__name__})"
    return out


def report_header(args) -> None:
    v = versions()
    trl = f", trl {v['trl']}" if "trl" in v else ""
    print(f"torch threads: {torch.get_num_threads()}")
    print(f"versions: torch {v['torch']}, lightning {v['lightning']}, transformers "
          f"{v['transformers']}, peft {v['peft']}{trl}")


# ----------------------------------------------------------------------------------------------- memory
def memory_child(args) -> None:
    """One side, ``args.child`` in {ours, ours-adapter, trl}: build, run 2 iterations, print a JSON line."""
    from lightning.pytorch import Trainer

    model_dir = Path(args.model_dir)
    prompts = make_prompts(64, SMOLLM2["vocab_size"], args.seed)
    t = time.perf_counter()
    if args.child.startswith("ours"):
        module, data = ours_parts(model_dir, prompts, args, reward="adapter" if args.child == "ours-adapter"
                                  else "separate")
        trainer = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False, max_epochs=-1, num_sanity_val_steps=0,
                          limit_val_batches=0, max_steps=2 * module.updates_per_rollout(args.batch))
        trainer.fit(module, datamodule=data)
    else:
        args.warmup, args.iters = 0, 2
        trl_trainer(model_dir, prompts, args, []).train()
    import resource

    print(json.dumps({"side": args.child, "seconds": time.perf_counter() - t,
                      "self_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def memory_run(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        build_model(model_dir, SMOLLM2, args.seed)
        export_reward_adapter(model_dir)
        results = {}
        for side in ("trl", "ours", "ours-adapter"):
            cmd = [sys.executable, __file__, "--child", side, "--model-dir", str(model_dir), "--batch",
                   str(args.batch), "--new", str(args.new), "--threads", str(args.threads)]
            if args.value_from_policy and side != "trl":
                cmd.append("--value-from-policy")
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            out = proc.stdout.read()
            _, status, usage = os.wait4(proc.pid, 0)
            if status != 0:
                raise RuntimeError(f"{side} child failed ({status}): {out[-2000:]}")
            line = json.loads([x for x in out.splitlines() if x.startswith("{")][-1])
            results[side] = (usage.ru_maxrss / 1024, line["seconds"])
    report_header(args)
    critic = "value head on the policy trunk" if args.value_from_policy else "value adapter"
    print(f"model: SmolLM2-135M shape (h576 L30 heads 9/3 ffn1536 vocab49152 tied), random; batch {args.batch}, "
          f"response {args.new}, LoRA r=8 policy, ours: {critic}; 2 iterations per child\n")
    print("| side | peak RSS MiB (child ru_maxrss) | wall s |")
    print("|---|---|---|")
    names = {"trl": "TRL PPOTrainer (policy+LoRA, value model, reward model)",
             "ours": "lrlhf, reward = separate ScalarModel",
             "ours-adapter": "lrlhf, reward = LoRA adapter on the policy's base (one base, four roles)"}
    for side, (rss, secs) in results.items():
        print(f"| {names[side]} | {rss:.0f} | {secs:.1f} |")
    print()
    for side in ("ours", "ours-adapter"):
        print(f"ratio {side} / TRL: {results[side][0] / results['trl'][0]:.3f}  (target <= 0.6)")


def export_reward_adapter(model_dir: Path) -> None:
    """A LoRA reward model on ``model_dir`` exported as :meth:`RewardModule.export` does (untrained adapter,
    random head: the figures are about memory)."""
    from lrlhf.models import LoraSpec, ModelConfig
    from lrlhf.modules import RewardConfig, RewardModule

    module = RewardModule(ModelConfig(str(model_dir)), RewardConfig(lora=LoraSpec(r=8)))
    module.export(model_dir.parent / "rm")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=6, help="timed iterations per side")
    parser.add_argument("--warmup", type=int, default=1, help="untimed first iterations per side")
    parser.add_argument("--batch", type=int, default=None, help="prompts per iteration (16; memory: 8)")
    parser.add_argument("--new", type=int, default=None, help="response tokens (64; memory: 32)")
    parser.add_argument("--full", action="store_true", help="TRL with a full-parameter policy")
    parser.add_argument("--memory", action="store_true", help="peak RSS at the SmolLM2-135M shape")
    parser.add_argument("--value-from-policy", action="store_true",
                        help="ours with module/critic=shared_trunk (the critic's head on the policy's trunk)")
    parser.add_argument("--sampling", action="store_true", help="time our rollout sampler alone (tokens/s)")
    parser.add_argument("--decoding", default="auto",
                        help="ours: module.config.decoding (auto|eager|static|compiled); with --sampling a comma "
                        "list is timed mode by mode on the same prompts, e.g. eager,static,compiled")
    parser.add_argument("--peers", default="", help="with --sampling: also time these peers on the same batch "
                        "(generate: plain transformers generate, the per-decode-step overhead beside ours)")
    parser.add_argument("--engine", default="local", choices=["local", "merged"], help="ours: module/engine=...")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="both sides on this device")
    parser.add_argument("--shape", default="reference", choices=sorted(SHAPES),
                        help="model shape of the time and sampling runs (reference: the CPU config above)")
    parser.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"],
                        help="fp32, or fp32 weights under bf16 autocast on both sides")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False")
    if (args.memory or args.child) and (args.device, args.shape, args.precision) != ("cpu", "reference", "32-true"):
        parser.error("--memory measures the CPU process RSS at the SmolLM2 shape: no --device/--shape/--precision")
    small = args.memory or args.child
    args.batch = args.batch or (8 if small else 16)
    args.new = args.new or (32 if small else 64)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    if args.child:
        memory_child(args)
        return
    if args.memory:
        memory_run(args)
        return
    if args.sampling:
        from sampler_speed import sampling_run  # bench/ is the script's folder

        result = sampling_run(args)
    else:
        result = time_run(args)
    if args.json:
        result.update(command=" ".join(["python", *sys.argv]), device=args.device, device_name=device_name(args.device),
                      shape=args.shape, shape_config=SHAPES[args.shape], precision=args.precision, batch=args.batch,
                      new=args.new, iters=args.iters, warmup=args.warmup, threads=args.threads, versions=versions())
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
