"""Child process of test_sigkill_mid_write: PPO with checkpoints every rollout; the third write is large and slow.

    python sigkill_child.py WORLD_DIR ROOT

The third checkpoint carries 32 MB of ballast and is written in 1 MB chunks; after the first chunk the child
creates ``ROOT/writing`` and keeps writing slowly, so the parent can SIGKILL it mid-write.
"""

import io
import sys
import time
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.io import TorchCheckpointIO

sys.path.insert(0, str(Path(__file__).parent))
from conftest import make_data, make_module, make_trainer

from lrlhf.callbacks import ResumableCheckpoint
from lrlhf.data.toy import ToyWorldPaths

SLOW_ROLLOUT = 3


class Ballast(Callback):
    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        if pl_module.rollouts_done == SLOW_ROLLOUT:
            checkpoint["ballast"] = torch.zeros(8 * 2**20)


class SlowIO(TorchCheckpointIO):
    def __init__(self, marker: Path):
        self.marker = marker

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        if "ballast" not in checkpoint:
            return super().save_checkpoint(checkpoint, path, storage_options)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        data = buffer.getvalue()
        with open(path, "wb") as f:
            for start in range(0, len(data), 2**20):
                f.write(data[start:start + 2**20])
                f.flush()
                self.marker.touch()
                time.sleep(0.5)


def main():
    world_dir, root = Path(sys.argv[1]), Path(sys.argv[2])
    torch.set_num_threads(1)
    from transformers import AutoTokenizer

    world = ToyWorldPaths.under(world_dir)
    tokenizer = AutoTokenizer.from_pretrained(world.tokenizer)
    module = make_module(world, tokenizer)
    trainer = make_trainer(root, 4, module, [Ballast(), ResumableCheckpoint(dirpath=root / "ckpt")],
                           plugins=[SlowIO(root / "writing")])
    trainer.fit(module, datamodule=make_data(world, tokenizer))


if __name__ == "__main__":
    main()
