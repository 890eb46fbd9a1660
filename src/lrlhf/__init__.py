"""lrlhf: RLHF as PyTorch Lightning modules.

Layers (imports point down only): ``functional`` (pure tensor math) <- ``data`` <- ``models`` <-
``modules`` <- ``callbacks`` / ``eval`` <- ``cli``. Importing ``lrlhf`` itself stays light.
"""

__version__ = "0.1.0.dev0"
