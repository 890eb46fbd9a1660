"""TRL as an oracle: a few tests compare our math with TRL's own functions (trl 1.12.0, a test-only install: the
README's test command and CI's main leg install it with ``--no-deps``; the package never imports it)."""

import importlib
import os

import pytest


def require_oracle(module: str):
    """TRL's ``module``; without TRL the test skips, unless ``LRLHF_REQUIRE_ORACLES=1`` (CI's main leg), where a
    missing oracle fails the test: those claims must not go unchecked silently."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        if os.environ.get("LRLHF_REQUIRE_ORACLES") == "1":
            pytest.fail(f"the TRL oracle {module} is not importable ({err}): pip install --no-deps trl==1.12.0")
        pytest.skip("TRL is not installed (the oracle is optional)")
