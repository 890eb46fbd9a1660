"""What a run prints: our own lines, progress and warnings; third-party noise a user cannot act on is dropped.

:func:`setup_console` (called by ``lrlhf.run.cli.main`` before anything heavy is imported) filters, each by message
and by the module that emits it, never by category alone:

- Python warnings (:data:`NOISE_WARNINGS`): deprecations inside Lightning and transformers, Lightning's remarks
  on states we chose (a frozen reward model in eval mode, prompts with no validation step);
- log records (:data:`NOISE_LOGS`): Lightning's adverts ("Tip: ... litlogger / litmodels"), "`Trainer.fit`
  stopped: ..." (the progress bar shows where a stage ended), "GPU/TPU available: False", bitsandbytes' note on
  an optional CPU kernel;
- transformers' per-file progress bars ("Loading weights", "Writing model shards"; ``HF_HUB_DISABLE_PROGRESS_BARS``)
  and W&B's banner (``WANDB_SILENT`` offline, where the CLI says how to upload; ``WANDB_QUIET`` online, which
  keeps the run's URL). An environment variable the user set is left as it is.

Our own warnings are printed as ``warning: <message>`` (no file, line and source line); warnings and Lightning's log
lines are written above a progress bar (``tqdm.write``), not into it.

Verbose (``python train.py ... --verbose``, or ``LRLHF_VERBOSE=1``): nothing is filtered or reformatted.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from pathlib import Path

VERBOSE_ENV = "LRLHF_VERBOSE"
VERBOSE_FLAGS = ("--verbose",)

#: (message regex, matched at the start; category; emitting module regex): third-party warnings with nothing to act on.
NOISE_WARNINGS = (
    # torch deprecated LeafSpec; Lightning's pytree helper still uses it
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", Warning, r"lightning\.pytorch\.utilities\._pytree"),
    # peft reads the deprecated alias (transformers 5 renamed it is_activation_checkpointing)
    (r"`is_gradient_checkpointing` is deprecated", FutureWarning, r"transformers\.modeling_utils"),
    # PPO has no validation step; PromptDataModule shares ChatDataModule's (empty without a val source) loaders
    (r"You passed in a `val_dataloader` but have no `validation_step`", UserWarning, r"lightning\.pytorch\."),
    # the frozen parts (reward model, reference) are in eval mode on purpose
    (r"Found \d+ module\(s\) in eval mode at the start of training", Warning, r"lightning\.pytorch\."),
)
#: logger name: regexes of messages dropped (matched at the start of the message).
NOISE_LOGS = {
    "lightning.pytorch.utilities.rank_zero": (r"💡 Tip:", r"`Trainer\.fit` stopped: ",
                                              r"GPU available: False", r"TPU available: False"),
    "lightning.fabric.utilities.rank_zero": (r"💡 Tip:",),
    "bitsandbytes": (r"Failed to load CPU gemm_4bit_forward",),
    "bitsandbytes.backends.cpu.ops": (r"Failed to load CPU gemm_4bit_forward",),
}
_PACKAGE = str(Path(__file__).resolve().parents[1]) + os.sep


def stdout_is_terminal() -> bool:
    """Whether stdout is a terminal (progress bars redraw in place there; into a file they would append lines)."""
    return bool(getattr(sys.stdout, "isatty", lambda: False)())


def verbose_requested(argv: list[str]) -> tuple[bool, list[str]]:
    """Whether ``argv`` or ``LRLHF_VERBOSE`` asks for everything; ``argv`` without the flag."""
    rest = [a for a in argv if a not in VERBOSE_FLAGS]
    env = os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")
    return env or len(rest) != len(argv), rest


class _DropMessages(logging.Filter):
    def __init__(self, patterns: tuple[str, ...]):
        super().__init__()
        self.pattern = re.compile("|".join(f"(?:{p})" for p in patterns))

    def filter(self, record: logging.LogRecord) -> bool:
        return self.pattern.match(record.getMessage()) is None


_original_formatwarning = warnings.formatwarning


def _format_warning(message, category, filename, lineno, line=None) -> str:
    if str(filename).startswith(_PACKAGE):  # ours: the message says what to do; the source line does not
        return f"warning: {message}\n"
    return _original_formatwarning(message, category, filename, lineno, line)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` through ``tqdm.write``: above a progress bar, not into it."""
    from tqdm import tqdm

    stream = file if file is not None else sys.stderr
    try:
        tqdm.write(warnings.formatwarning(message, category, filename, lineno, line).rstrip("\n"), file=stream)
    except OSError:
        pass  # as warnings.showwarning: a closed or invalid stream loses the warning


def setup_console(verbose: bool = False, wandb_offline: bool | None = None) -> None:
    """Install the filters above (nothing when ``verbose``); idempotent. Call before transformers, huggingface_hub
    or wandb are imported (their switches are read at import or at ``wandb.init``).

    ``wandb_offline``: whether W&B will log offline (then its banner goes: the CLI says how to upload)."""
    if verbose:
        os.environ[VERBOSE_ENV] = "1"  # processes a launcher starts (Lightning's, one per device) inherit it
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if wandb_offline:
        os.environ.setdefault("WANDB_SILENT", "true")
    else:
        os.environ.setdefault("WANDB_QUIET", "true")
    for message, category, module in NOISE_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name, patterns in NOISE_LOGS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) for f in logger.filters):
            logger.addFilter(_DropMessages(patterns))
    warnings.formatwarning = _format_warning
    warnings.showwarning = _show_warning


class TqdmHandler(logging.StreamHandler):
    """A stream handler that writes through ``tqdm.write``: a log line printed while a progress bar is drawn
    goes above the bar instead of into it."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:
            self.handleError(record)


def route_logs_around_bars(name: str = "lightning.pytorch") -> None:
    """Replace the plain stream handlers of logger ``name`` (Lightning installs one at import; our callbacks'
    ``rank_zero_info`` lines go through it) with :class:`TqdmHandler`; idempotent."""
    logger = logging.getLogger(name)
    for handler in list(logger.handlers):
        if type(handler) is logging.StreamHandler:
            routed = TqdmHandler(handler.stream)
            routed.setLevel(handler.level)
            routed.setFormatter(handler.formatter)
            for f in handler.filters:
                routed.addFilter(f)
            logger.removeHandler(handler)
            logger.addHandler(routed)


# ---------------------------------------------------------------------------------------------- --help
ABOUT = "# about: "  # a recipe's second line: its one-line description, written for --help


def recipe_description(path: Path) -> str:
    """A recipe's one-line description for ``--help``: its ``# about: ...`` line (the one after the opening
    ``# python train.py recipe=NAME``); a recipe without one is an error naming the file."""
    lines = path.read_text().splitlines()
    if len(lines) < 2 or not lines[1].startswith(ABOUT):
        raise ValueError(f"{path}:2: a recipe's second line is its description for --help, '{ABOUT}...'")
    return lines[1][len(ABOUT):].strip()


def recipes_help(folder: Path) -> str:
    """``NAME  description`` for every recipe in ``folder``, aligned (``$`` escaped for Hydra's help template)."""
    paths = sorted(folder.glob("*.yaml"))
    width = max((len(p.stem) for p in paths), default=0)
    lines = [f"  {p.stem:<{width}}  {recipe_description(p)}" for p in paths]
    return "\n".join(lines).replace("$", "$$")


def judge_lines(summary: dict) -> list[str]:
    """What a held-out judge can see, printed next to every verdict it gives (``judge/accuracy`` and its
    companions, :func:`lrlhf.eval.judges.judge_accuracy`): its own pairwise accuracy on its held-out pairs beside
    what "the longer answer wins" scores there, and a plain warning when that accuracy cannot be told from chance
    (its 95% interval reaches 0.5) or is no better than length alone."""
    if "judge/accuracy" not in summary:
        return []
    accuracy = summary["judge/accuracy"]
    if accuracy is None:
        return ["  the judge's own held-out accuracy is not known (not an RM stage's judge): a verdict with no "
                "measure of what the judge can see"]
    interval, pairs, longer = (summary.get(f"judge/{k}") for k in ("accuracy_interval", "pairs", "longer_wins"))
    line = f"  the judge's own held-out pairwise accuracy: {accuracy:.3f}"
    line += f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else ""
    line += f" on {pairs} pairs" if pairs else ""
    line += f"; longer wins {longer:.3f}" if longer is not None else ""
    lines = [line]
    if (interval[0] if interval else accuracy) <= 0.5:
        lines.append("  warning: the judge's accuracy cannot be told from chance (its 95% interval reaches 0.5): this "
                     "verdict cannot tell a gain from none")
    elif longer is not None and accuracy <= longer:
        lines.append("  warning: the judge is no more accurate than 'the longer answer wins' on its own pairs: this "
                     "verdict may measure length")
    return lines


def print_summary(summary: dict) -> None:
    """The end of a run's console story: the stage's figures from its ``summary.json``, where its outputs are."""
    print(f"\n== lrlhf {summary.get('method', summary['stage'])}: done ==")
    if summary["stage"] == "eval":
        print(summary["table_markdown"])
        for line in judge_lines(summary):  # what the table's judge can see
            print(line.strip())
        print(f"table: {summary['table']} (and {summary['csv']}); plots: {', '.join(summary['plots'].values())}")
        if summary.get("figures_csv"):  # the plots' figures: frontier_curves.csv, goodhart.csv
            print(f"the plots' figures: {', '.join(summary['figures_csv'])}")
        print(f"run folder: {summary['run_dir']}")
        return
    if summary["stage"] == "iterative":  # the rounds' table (lrlhf.run.rounds), then the final policy as any PPO's
        print(summary["table_markdown"])
        print(f"{len(summary['rounds'])} rounds, {summary['labels_total']} preference labels, "
              f"{summary['ppo_steps_total']} PPO optimiser steps; table: {summary['table']}, plot: {summary['plot']}")
    for key in [k for k in summary if k.endswith("_minus_sft") and k.startswith(("gold/", "judge/"))]:
        kind, name = key[:-len("_minus_sft")].split("/", 1)  # a policy compared with SFT (its policy_name)
        lo, hi = summary[f"{key}_interval"]
        label, what = name.upper(), "held-out gold utility" if kind == "gold" else "held-out judge score"
        print(f"{what}: SFT {summary[f'{kind}/sft']:.3f}, {label} {summary[f'{kind}/{name}']:.3f}; "
              f"{label} - SFT {summary[key]:+.3f} (95% paired bootstrap [{lo:+.3f}, {hi:+.3f}])")
        if f"{kind}/{name}_win_rate" in summary:
            lo, hi = summary[f"{kind}/{name}_win_rate_interval"]
            print(f"  {label} win rate against SFT: {summary[f'{kind}/{name}_win_rate']:.3f} [{lo:.3f}, {hi:.3f}]")
        for line in judge_lines(summary) if kind == "judge" else ():
            print(line)
        if f"gold/{name}_solved" in summary and kind == "gold":
            lo, hi = summary[f"gold/{name}_solved_gain_interval"]
            solved, gain = summary[f"gold/{name}_solved"], summary[f"gold/{name}_solved_gain"]
            print(f"  solved exactly: SFT {summary['gold/sft_solved']:.3f}, {label} {solved:.3f} "
                  f"({gain:+.3f} [{lo:+.3f}, {hi:+.3f}])")
    if "test/accuracy_interval" in summary:  # a reward model, with what length alone scores on the same pairs
        lo, hi = summary["test/accuracy_interval"]
        print(f"held-out pairwise accuracy: {summary['test/pair_accuracy']:.3f} (95% bootstrap [{lo:.3f}, {hi:.3f}], "
              f"{summary['test/pairs']} pairs); longer wins {summary['test/longer_wins']:.3f}, shorter wins "
              f"{summary['test/shorter_wins']:.3f}")
    if "test/gold_accuracy" in summary:  # pairs with golds (a pairs stage's): the RM against the gold order
        lo, hi = summary["test/gold_accuracy_interval"]
        print(f"against the gold order: {summary['test/gold_accuracy']:.3f} ([{lo:.3f}, {hi:.3f}], "
              f"{summary['test/gold_pairs']} pairs whose golds differ); the labels' own agreement with gold there "
              f"{summary['test/labels_gold_agreement']:.3f}")
    if "chosen/rollout" in summary:
        method = summary.get("method", "ppo").upper()  # grpo_lora's "ppo" stage trained GRPO
        print(f"chosen {method} checkpoint: rollout {summary['chosen/rollout']} by held-out utility "
              f"{summary['chosen/heldout_utility']:.3f} (early stopping); Goodhart plot: {summary['goodhart_plot']}")
        if summary.get("chosen/starting_policy"):
            print(f"no {method} update improved held-out utility: the exported policy is the starting one (rollout 0)")
    for key, value in summary.items():  # the stage's own figures (its stage_summary and finish)
        if isinstance(value, float) and not key.startswith(("gold/", "judge/", "chosen/")) and key != "train/loss":
            print(f"{key}: {value:.4f}")
    print(f"run folder: {summary['run_dir']}")
    print(f"exported model: {summary['export']}")
    if summary.get("adapter"):
        print(f"adapter: {summary['adapter']}")
