"""Errors raised by the data path. Both are ``ValueError``s, so callers that catch that keep working."""


class DataFormatError(ValueError):
    """Input that cannot be read as the requested kind of record.

    The message names where (file and 1-based line, or ``file[index]`` for a JSON list, or
    ``dataset[split][index]``), what (the field) and what would have been accepted (formats, roles, ranges).
    """


class EmptyDatasetError(DataFormatError):
    """Nothing was left after reading and filtering; the message gives the count removed by each filter."""
