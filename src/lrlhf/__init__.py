"""lrlhf: RLHF as PyTorch Lightning modules.

Layers (imports point down only): ``functional`` (pure tensor math), ``utils`` <- ``data`` <- ``models`` <-
``modules`` (LightningModules) and ``eval`` (measures models; never imports ``modules`` or ``callbacks``) <-
``callbacks`` (may use ``eval``) <- ``cli`` / ``planning``; tests/test_architecture.py checks it. Importing ``lrlhf``
itself stays light.
"""

__version__ = "0.1.0.dev0"
