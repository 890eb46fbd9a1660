"""Thin shim: ``python train.py recipe=ppo_lora [overrides...]`` -> :func:`lrlhf.run.cli.main`."""

from lrlhf.run.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
