"""An artifact's identity (format/artifact_kinds.py) read from its files: in a discovered package for IV510 and
the reload plan, or on disk for the recorder (`run.artifact(path)` without a kind) and `init`.

Both read the same few things: the names under the artifact, its top-level library documents (JSON, bounded by
the one JSON reader) and the tensor names of at most two safetensors files (their headers only).
"""
from __future__ import annotations

import os
from pathlib import Path

from ..format import artifact_kinds
from ..format.artifact_kinds import Identity
from .files import read_safetensors_header
from .jsonread import read_json_file

DOCUMENT_MAX = 8 << 20  # a config.json or model_index.json is a few kilobytes; a larger one is no such document
WALK_MAX = 100_000  # names under an artifact looked at: a model folder holds tens, a checkpoint hundreds


def in_package(ctx, rel: str) -> Identity | None:
    """The identity of the package's artifact at `rel` (package-relative, existing), from the inventory."""
    is_folder = rel in ctx.inventory.dirs
    if is_folder:
        prefix = rel.rstrip("/") + "/"
        files = [path[len(prefix):] for path in ctx.inventory.files_under(rel) if path.startswith(prefix)]
    elif ctx.inventory.is_file(rel):
        files = [rel.rsplit("/", 1)[-1]]
    else:
        return None
    folder = rel.rstrip("/") + "/" if is_folder else rel[: -len(files[0])]
    documents, tensors = artifact_kinds.wanted(files, is_folder)
    parsed = {name: ctx.documents.json_value(folder + name) for name in documents}
    names = {}
    for name in tensors:
        header = ctx.documents.safetensors_header(folder + name)
        names[name] = list(header.entries) if header is not None else []
    return artifact_kinds.identify(rel, files, is_folder, parsed, names)


def on_disk(path: str | os.PathLike, name: str | None = None) -> Identity | None:
    """The identity of the file or folder at `path` (links not followed), `name` its package path."""
    path = Path(path)
    name = name or path.name
    if path.is_dir() and not path.is_symlink():
        files = []
        for folder, dirs, names in os.walk(path):
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
            here = os.path.relpath(folder, path)
            files += [n if here == "." else f"{here}/{n}".replace(os.sep, "/") for n in names]
            if len(files) > WALK_MAX:
                break
        is_folder = True
    elif path.is_file():
        files, is_folder = [path.name], False
    else:
        return None
    base = path if is_folder else path.parent
    documents, tensors = artifact_kinds.wanted(files, is_folder)
    parsed = {}
    for document in documents:
        try:
            parsed[document] = read_json_file(base / document, max_bytes=DOCUMENT_MAX)
        except (OSError, ValueError):
            parsed[document] = None
    names = {}
    for tensor_file in tensors:
        header = read_safetensors_header(base / tensor_file)
        names[tensor_file] = list(header.entries) if header is not None else []
    return artifact_kinds.identify(name, files, is_folder, parsed, names)
