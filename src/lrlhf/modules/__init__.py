"""LightningModules: each ``training_step`` reads as numbered steps over :mod:`lrlhf.functional`."""

from lrlhf.modules.sft import SFTConfig, SFTModule

__all__ = ["SFTConfig", "SFTModule"]
