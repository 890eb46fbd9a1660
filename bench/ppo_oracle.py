"""PPO with the toy world's gold utility as its reward (an oracle reward model): what the optimiser, the KL penalty
and the LoRA policy reach when the reward is never wrong (issue #17's diagnosis: is the RM or PPO the limit?).

    PYTHONPATH=bench python train.py recipe=ppo_lora module._target_=ppo_oracle.GoldRewardPPO \
        '+module.world_dir=${world.dir}' \
        'module.calibration={_target_:lrlhf.modules.calibration.ReferenceSamples,n_prompts:256}' logger=csv

The gold utility of each sampled response replaces the RM score; the calibration is measured on the reference's
own samples (as for a real model's RM), so the reward PPO sees has the scale of a calibrated RM's.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lrlhf.data.toy import gold_utility
from lrlhf.models.generation import cut_at_eos
from lrlhf.modules import PPOModule


class GoldRewardPPO(PPOModule):
    """:class:`PPOModule` whose ``score`` is the gold utility of the response for the prompt's task (prompts are
    matched by their text to the world's files)."""

    def __init__(self, *args, world_dir: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.world_dir = world_dir

    def _tasks(self) -> dict[str, dict]:
        if not hasattr(self, "_task_by_text"):
            self._task_by_text = {}
            for path in Path(self.world_dir).glob("*.jsonl"):  # every file's prompts: RL, evaluation, sample table
                for line in path.read_text().splitlines():
                    record = json.loads(line)
                    for message in record.get("prompt") or record.get("messages") or []:
                        if message["role"] == "user" and "task" in record:
                            self._task_by_text[message["content"]] = record["task"]
        return self._task_by_text

    @torch.no_grad()
    def score(self, query_ids, query_mask, response_ids, masks):
        tasks = self._tasks()
        eos = set(self.eos_token_ids)
        out = []
        for q, r in zip(query_ids.tolist(), response_ids.tolist(), strict=True):
            prompt = self.tokenizer.decode(q, skip_special_tokens=True)
            text = max((text for text in tasks if text in prompt), key=len)  # the longest: a prompt may hold another
            task = tasks[text]
            out.append(gold_utility(task, self.tokenizer.decode(cut_at_eos(r, eos), skip_special_tokens=True)))
        return torch.tensor(out, device=query_ids.device)
