"""Logging: rlx reports through the standard `logging` module, under the logger "rlx".

Quiet by default: the "rlx" logger carries a NullHandler, so nothing is printed unless the
application configures logging (``logging.basicConfig(level=logging.INFO)``) or calls
``rlx.logs.log_to_stderr()``. The C core's own lines (plans compiled, memory plans, refused
connections of the TCP mesh) arrive on "rlx.core" through ``_C.set_log_callback``; the core may log
from any thread, and the binding takes the GIL before calling in. Python-side modules log under
"rlx.<module>" (rlx.api: loading, prefix reuse; rlx.server: requests).
"""

from __future__ import annotations

import logging

from rlx import _C

__all__ = ["logger", "log_to_stderr"]

logger = logging.getLogger("rlx")
logger.addHandler(logging.NullHandler())

_core = logging.getLogger("rlx.core")
_LEVELS = {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING}


def _from_core(level: int, message: str) -> None:
    _core.log(_LEVELS.get(level, logging.WARNING), message)


def log_to_stderr(level: int | str = logging.INFO) -> logging.Handler:
    """Prints rlx's log lines at `level` and above to stderr (a handler on the "rlx" logger);
    returns the handler (remove it with logging.getLogger("rlx").removeHandler(h))."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[%(name)s] %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)
    return handler


_C.set_log_callback(_from_core)
