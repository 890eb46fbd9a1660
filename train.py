"""Thin shim: ``python train.py recipe=ppo_lora [overrides...]`` -> :func:`lrlhf.cli.main`."""

from lrlhf.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
