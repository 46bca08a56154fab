"""Lets PyPI's torchvision 0.28.0 (built for CUDA torch) import beside the CPU torch 2.13.0 of this project's venv.

Its compiled operators do not load beside the CPU torch, and its Python side then fails at import
(`operator torchvision::nms does not exist`) — and transformers imports torchvision whenever it is installed, so
every model import failed. Declaring the two operator schemas its meta registrations look up is enough for the
Python side (nothing here runs them). The Makefile installs this module with a .pth line into the venv only: it is
not part of itera-verify, and a user's own matched torch + torchvision never sees it. It costs nothing until
something imports torchvision (a meta-path hook), and acts only when that import fails. Every Python process
of the venv imports it at start: the import system's protocols are met without importlib.abc's base classes,
whose import (importlib.resources, pathlib) was most of a bare interpreter's start.
"""
from __future__ import annotations

import importlib.machinery
import sys

SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
           "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_LIBRARY = []  # the torch.library.Library must stay alive, or its definitions go with it


def declare() -> None:
    import torch

    try:
        torch.ops.torchvision.nms.default  # noqa: B018 - already there (a torchvision whose operators loaded)
        return
    except (AttributeError, RuntimeError):
        pass
    library = torch.library.Library("torchvision", "DEF")
    for schema in SCHEMAS:
        library.define(schema)
    _LIBRARY.append(library)


class _Loader:
    """torchvision's own import first; only when it fails on an operator its compiled part did not register are
    the schemas declared and the import retried (a torchvision whose operators load is never touched: declaring
    them before it would collide with its own registration)."""

    def __init__(self, wrapped):
        self.wrapped = wrapped

    def create_module(self, spec):
        return self.wrapped.create_module(spec)

    def exec_module(self, module):
        try:
            self.wrapped.exec_module(module)
        except RuntimeError as exc:
            if "torchvision::" not in str(exc):
                raise
            for name in [name for name in sys.modules if name.startswith("torchvision.")]:
                del sys.modules[name]
            declare()
            self.wrapped.exec_module(module)


class _Finder:
    def find_spec(self, name, path=None, target=None):
        if name != "torchvision":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
