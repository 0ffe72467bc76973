"""Exceptions raised by rlx's Python-side loaders.

Both derive from ValueError, so callers that treat bad input generically can catch ValueError.
"""


class ConfigError(ValueError):
    """A model config is missing a field, has a field of the wrong type, or asks for something
    rlx does not support. The message names the field and the offending value."""


class WeightsError(ValueError):
    """A weights file is unreadable or malformed, or the tensors do not match the config
    (missing, extra, mis-shaped). The message names the file or the tensor."""
