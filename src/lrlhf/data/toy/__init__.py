"""The toy world: lrlhf's embedded, deterministic RLHF task (docs/toy_world.md).

Two request kinds (sort numbers, count items) with a gold utility in [0, 1], simulated annotators
(Bradley–Terry on gold with noise, a tie band and a length bias), a middling demonstrator, a word-level
tokenizer with a chat template and a tiny Llama, all from a seed. ``build_world`` writes ordinary JSONL
files in the canonical formats, so the world flows through the real data path.
"""

from .annotators import (
    AnnotatorConfig,
    accuracy_ceiling,
    expected_agreement,
    label_probabilities,
    observed_agreement,
    sample_label,
    sample_ranks,
)
from .demonstrator import CandidateConfig, DemonstratorConfig, candidate, demonstrate
from .model import TinyModelConfig, build_model
from .tasks import KINDS, TaskConfig, ideal_answer, prompt_messages, prompt_text, sample_task, task_from_prompt
from .utility import gold_utilities, gold_utility, verifiable_reward
from .vocab import CHAT_TEMPLATE, build_tokenizer, vocabulary
from .world import ToyWorldPaths, WorldConfig, WorldSizes, build_world, describe, generate_world_data

__all__ = [
    "CHAT_TEMPLATE", "KINDS", "AnnotatorConfig", "CandidateConfig", "DemonstratorConfig", "TaskConfig",
    "TinyModelConfig", "ToyWorldPaths", "WorldConfig", "WorldSizes", "accuracy_ceiling", "build_model",
    "build_tokenizer", "build_world", "candidate", "demonstrate", "describe", "expected_agreement",
    "generate_world_data", "gold_utilities", "gold_utility", "ideal_answer", "label_probabilities",
    "observed_agreement", "prompt_messages", "prompt_text", "sample_label", "sample_ranks", "sample_task",
    "task_from_prompt", "verifiable_reward", "vocabulary",
]
