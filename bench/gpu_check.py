"""The Python side of ``bench/gpu_check.sh`` (see its header): which carried wheels to install, what the machine
is, and the Markdown block for bench/RESULTS.md.

    python bench/gpu_check.py wheels DIR          # the wheels of DIR whose distribution is not installed yet
    python bench/gpu_check.py env OUT.json        # versions, GPU, driver (also printed)
    python bench/gpu_check.py report LOGS TMP     # the block, from LOGS/<part>.{argv,status,json,log}

``wheels`` uses the standard library only (it runs before the carried packages are on the path); ``report`` too
(it must print what the parts measured even when one of them could not import torch).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

#: distributions whose versions the block names, in this order (import name for the ones that differ)
PACKAGES = ("torch", "transformers", "peft", "lightning", "torchmetrics", "trl", "datasets", "hydra-core",
            "omegaconf", "matplotlib")
#: the parts of gpu_check.sh: (file stem, title)
PARTS = (("e2e", "README main command, end to end"), ("compare", "one PPO iteration, lrlhf vs TRL"),
         ("sampling", "rollout sampling throughput (ours)"),
         ("merged", "sampling on the merged bf16 copy (module/engine=merged)"),
         ("scale", "one PPO iteration at the Llama-3.1-8B shape, bf16"))
#: parts run only with what is left of the budget: not run for want of time is not a failure
OPTIONAL_PARTS = ("merged", "scale")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


# ------------------------------------------------------------------------------------------------ wheels
def select_wheels(folder: Path, force: bool = False) -> list[Path]:
    """The ``*.whl`` of ``folder`` to install: those whose distribution this interpreter lacks (all with
    ``force``). A distribution already installed is left alone (its version is reported by ``env``), so the
    machine's own numpy-linked packages are never shadowed by a carried build."""
    chosen = []
    for wheel in sorted(folder.glob("*.whl")):
        name, version = wheel.name.split("-")[:2]
        have = _installed(_normalise(name))
        if have is not None and not force:
            print(f"  wheel {wheel.name}: skipped, {name} {have} is installed", file=sys.stderr)
            continue
        print(f"  wheel {wheel.name}: install", file=sys.stderr)
        chosen.append(wheel)
    return chosen


# --------------------------------------------------------------------------------------------------- env
def environment() -> dict:
    import platform

    env: dict = {"python": platform.python_version(), "versions": {}}
    for name in PACKAGES:
        env["versions"][name] = _installed(name) or "absent"
    try:
        import torch

        env["versions"]["torch"] = torch.__version__  # the local label (+cu128 / +cpu)
        env["cuda_available"] = torch.cuda.is_available()
        env["torch_cuda"] = torch.version.cuda
        env["gpu"] = torch.cuda.get_device_name() if env["cuda_available"] else None
    except Exception as err:  # reported, not fatal: the parts will say what fails
        env["torch_error"] = repr(err)
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout.strip().splitlines()
        name, memory, driver = (x.strip() for x in out[0].split(","))
        env.update(gpu=name, gpu_memory=memory, driver=driver, gpus=len(out))
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        env.setdefault("driver", None)
    return env


# ------------------------------------------------------------------------------------------------ report
def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _command(logs: Path, part: str, tmp: str) -> str:
    argv = (logs / f"{part}.argv").read_bytes().decode().split("\0")[:-1] if (logs / f"{part}.argv").exists() else []
    if not argv:
        return "(not run)"
    if Path(argv[0]).name.startswith("python"):
        argv[0] = "python"
    argv = [a.replace(str(logs), "<logs>").replace(tmp, "<tmp>") for a in argv]
    return shlex.join(argv)


def _tail(path: Path, n: int = 6) -> list[str]:
    try:
        lines = [x.rstrip() for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ["(no log)"]
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", x)[-300:] for x in lines if "Loading weights" not in x]
    return lines[-n:]


def _e2e(logs: Path) -> str:
    s = _load(logs / "e2e_summary.json")
    if not s or "gold/ppo" not in s:
        return "no summary.json"
    lo, hi = s["gold/ppo_minus_sft_interval"]
    text = (f"held-out gold SFT {s['gold/sft']:.3f} -> PPO **{s['gold/ppo']:.3f}**, PPO - SFT "
            f"{s['gold/ppo_minus_sft']:+.3f} [{lo:+.3f}, {hi:+.3f}] (95 % paired bootstrap); "
            f"{s.get('rollouts')} rollouts")
    if "chosen/rollout" in s:
        text += f", kept rollout {s['chosen/rollout']} (held-out {s['chosen/heldout_utility']:.3f})"
    if s.get("rollout/kl_seq") is not None:
        text += f"; last KL {s['rollout/kl_seq']:.2f}, beta {s['kl/beta']:.3f}"
    guard = _first_ratio_deviations(logs / "e2e_metrics.csv")
    if guard:
        text += (f"; first-update mean |ratio - 1| (the run-time guard's statistic) max {max(guard):.2g}, median "
                 f"{sorted(guard)[len(guard) // 2]:.2g} over {len(guard)} rollouts")
    return text


def _first_ratio_deviations(path: Path) -> list[float]:
    """The guard's ``guard/first_ratio_deviation`` of every logged rollout in the run's CSV metrics."""
    import csv

    try:
        with path.open() as f:
            return [float(r["guard/first_ratio_deviation"]) for r in csv.DictReader(f)
                    if r.get("guard/first_ratio_deviation")]
    except (OSError, KeyError, ValueError):
        return []


def _compare(logs: Path) -> str:
    c = _load(logs / "compare.json")
    if not c:
        return "no figures"
    o, t = c["ours_s"], c["trl_s"]
    phases = ", ".join(f"{k} {v:.3f} s" for k, v in c["phases_s"].items())
    text = (f"lrlhf **{o[0]:.3f} s** (q {o[1]:.3f}-{o[2]:.3f}) vs TRL **{t[0]:.3f} s** (q {t[1]:.3f}-{t[2]:.3f}) "
            f"per iteration: **{c['ratio']:.3f}x**; our phases {phases}; {c['warmup']} warm-up + {c['iters']} timed "
            f"per side, our mean response length {c['our_mean_length']:.1f}")
    if c.get("peak_cuda_gib") is not None:
        text += f"; peak CUDA memory {c['peak_cuda_gib']:.1f} GiB (both sides)"
    return text


def _sampling(logs: Path, stem: str = "sampling") -> str:
    s = _load(logs / f"{stem}.json")
    if not s:
        return "no figures"
    parts = []
    for decoding, d in (s.get("decodings") or {"": s}).items():
        parts.append(f"{decoding + ': ' if decoding else ''}**{d['tokens_per_s']:,.0f} tokens/s** ({s['rows']} rows x "
                     f"{max(d['columns'])} columns in {d['median_s']:.3f} s, median of {s['iters']} after "
                     f"{s['warmup']} warm-up; {1000 * d['median_s'] / max(d['columns']):.1f} ms per decode step"
                     + (f"; compile {d['compile_s']:.1f} s" if d.get("compile_s") else "") + ")")
    text = "; ".join(parts)
    if s.get("peak_cuda_gib") is not None:
        text += f"; peak CUDA memory {s['peak_cuda_gib']:.1f} GiB"
    return text


def _scale(logs: Path) -> str:
    s = _load(logs / "scale.json")
    if not s:
        return "no figures"
    memory = f"peak {s['peak_gib']:.1f} GiB" if s.get("peak_gib") is not None else "no CUDA memory figure"
    if not s.get("fits"):
        return f"**does not fit**: out of memory in {s.get('failed_in')} ({memory})"
    phases = ", ".join(f"{k} {v:.2f} s" for k, v in s["phases_s"].items())
    return (f"fits: **{s['iteration_s']:.2f} s** per iteration ({phases}; {s['batch']} prompts x {s['new']} tokens); "
            f"{memory}; built in {s['build_s']:.0f} s")


def report(logs: Path, tmp: str, dry_run: bool, total_s: int) -> tuple[str, bool]:
    env = _load(logs / "env.json") or {}
    v = env.get("versions", {})
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if dry_run:
        title = f"### GPU check, DRY RUN on CPU (tiny shape, not a performance figure), {when}"
        machine = "CPU only (`--dry-run`: tiny shape, 1 torch thread); no GPU, no driver"
    else:
        title = f"### GPU check (bench/gpu_check.sh), {when}"
        machine = (f"{env.get('gpu') or 'no GPU found'}"
                   f"{' (' + env['gpu_memory'] + ')' if env.get('gpu_memory') else ''}, driver "
                   f"{env.get('driver') or 'unknown'}, CUDA {env.get('torch_cuda') or 'n/a'} (torch build)")
    lines = [title, "",
             f"`bash bench/gpu_check.sh{' --dry-run' if dry_run else ''}`, {total_s} s in all. Machine: {machine}; "
             f"Python {env.get('python', '?')}.",
             "Versions: " + ", ".join(f"{k} {v.get(k, '?')}" for k in PACKAGES) + ".", "",
             "| part | command | result | wall | status |", "|---|---|---|---|---|"]
    figures = {"e2e": _e2e, "compare": _compare, "sampling": _sampling,
               "merged": lambda logs: _sampling(logs, "merged"), "scale": _scale}
    ok = True
    notes = []
    for i, (part, title_) in enumerate(PARTS, 1):
        status = _load(logs / f"{part}.status") or {"rc": None, "wall_s": None, "timeout_s": None}
        rc = status["rc"]
        if rc == 0:
            state = "ok"
        elif rc in (124, 137):
            state = f"**FAILED**: timed out after {status['timeout_s']} s"
        elif rc is None:
            state = "**FAILED**: not run"
        elif rc == 125:
            state = "**FAILED**: not run, out of the time budget"
        else:
            state = f"**FAILED** (exit {rc})"
        ok = ok and (rc == 0 or (rc == 125 and part in OPTIONAL_PARTS))
        result = figures[part](logs) if rc == 0 else "-"
        wall = f"{status['wall_s']} s" if status["wall_s"] is not None else "-"
        lines.append(f"| {i}. {title_} | `{_command(logs, part, tmp)}` | {result} | {wall} | {state} |")
        if rc != 0:
            notes.append((f"{i}. {title_}", _tail(logs / f"{part}.log")))
        extra = logs / f"{part}.note"
        if extra.exists():
            lines.append(f"|  | note | {extra.read_text().strip()} |  |  |")
    if notes:
        lines += ["", "Failed parts, last lines of their logs:"]
        for name, tail in notes:
            lines += ["", f"{name}:", "```", *tail, "```"]
    setup = logs / "setup.note"
    if setup.exists():
        ok = False
        lines += ["", f"Setup: {setup.read_text().strip()}"]
    lines += ["", f"Logs (`<logs>`): {logs}; `<tmp>`: a temporary folder, removed at the end."]
    return "\n".join(lines), ok


def main() -> int:
    if len(sys.argv) < 3 or sys.argv[1] not in ("wheels", "env", "report"):
        print(__doc__, file=sys.stderr)
        return 2
    if sys.argv[1] == "wheels":
        for wheel in select_wheels(Path(sys.argv[2]), force="--force" in sys.argv):
            print(wheel)
        return 0
    if sys.argv[1] == "env":
        env = environment()
        Path(sys.argv[2]).write_text(json.dumps(env, indent=2) + "\n")
        print("env:", json.dumps(env))
        return 0
    block, ok = report(Path(sys.argv[2]), sys.argv[3], "--dry-run" in sys.argv,
                       int(sys.argv[sys.argv.index("--total-s") + 1]) if "--total-s" in sys.argv else -1)
    print(block)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
