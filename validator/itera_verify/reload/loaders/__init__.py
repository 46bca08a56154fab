"""One module per reload.json loader; each exposes `reload(job, device, outcome)` and reports facts only. Which
module serves which loader is format/loaders.py's table."""
from __future__ import annotations

import importlib

from ...format.loaders import LOADERS as TABLE

MODULES = {name: row.module for name, row in TABLE.items()}
LOADERS = tuple(MODULES)


def loader_module(name: str):
    """The module of a loader, imported only in the reload child (it pulls in torch and the libraries)."""
    return importlib.import_module(f"{__name__}.{MODULES[name]}")
