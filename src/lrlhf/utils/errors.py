"""Errors shared by every layer."""


class InvariantError(RuntimeError):
    """An invariant the math relies on does not hold at run time (a measured value, not a bad input): the run
    stops, naming the value and the likely cause, instead of training on corrupted data."""


__all__ = ["InvariantError"]
