"""The 40-hex commit a base model was really loaded from, read from the local Hugging Face hub cache.

Layout (what huggingface_hub writes): `models--{org}--{name}/refs/{branch}` holds a commit, and
`snapshots/{commit}/` the files. A branch or tag is never a pin (IV501): it is resolved to its commit here."""
from __future__ import annotations

import os
import re
from pathlib import Path

from ..runtime.environment import Environment
from ..format.names import PINNED_REVISION
from ..runtime import hfcache
from ..runtime.hfcache import resolve_hf_cache
from ..model import UsageError
from ..package.artifact_identity import on_disk
from .errors import RecordError

# What a base can be: the folders a library loads whole from a hub id (an adapter or a LoRA is never a base).
BASE_KINDS = ("transformers-model", "diffusers-pipeline", "timm-model", "sentence-transformers-model")

COMMIT = PINNED_REVISION


def hub_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The hub cache, found as the checker finds it (docs/format.md --hf-cache): `cache_dir` (a hub cache or an
    HF_HOME), else HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    try:
        # The recorder is an entry point of its own: the environment is read here, once per call.
        return resolve_hf_cache(cache_dir, Environment.read())
    except UsageError as exc:
        raise RecordError(str(exc).replace("--hf-cache", "hub cache")) from None


def repo_folder(repo_id: str, cache_dir: str | os.PathLike | None = None) -> Path:
    return hfcache.repo_folder(hub_cache_dir(cache_dir), repo_id)


def resolve_commit(repo_id: str, revision: str | None = None,
                   cache_dir: str | os.PathLike | None = None) -> str:
    """The commit of `repo_id` at `revision` (a commit, a branch or a tag; default `main`) in the local cache.

    Refused when the cache does not hold that snapshot: a reviewer could not reload the adapter either."""
    if not isinstance(repo_id, str) or not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", repo_id):
        raise RecordError(f"base model {repo_id!r} is not a hub id (org/name): an adapter's base must be a "
                          "hub id at a pinned revision, never a local path (IV502)")
    repo = repo_folder(repo_id, cache_dir)
    revision = revision or "main"
    if COMMIT.fullmatch(revision):
        commit = revision
    else:
        ref = repo / "refs" / revision
        try:
            commit = ref.read_text(encoding="utf-8").strip()
        except OSError:
            raise RecordError(f"{repo_id}: the hub cache {hub_cache_dir(cache_dir)} has no ref {revision!r}; "
                              "load the base with cache_dir= pointing at the cache it came from, or pass its "
                              "40-hex commit") from None
        if not COMMIT.fullmatch(commit):
            raise RecordError(f"{ref} does not hold a 40-hex commit")
    if not (repo / "snapshots" / commit).is_dir():
        raise RecordError(f"{repo_id}@{commit}: no such snapshot in the hub cache {hub_cache_dir(cache_dir)}")
    return commit


def loaded_commit(model) -> str | None:
    """The commit transformers recorded when it loaded `model` (a PeftModel's base included), if any."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    commit = getattr(getattr(base, "config", None), "_commit_hash", None)
    return commit if isinstance(commit, str) and COMMIT.fullmatch(commit) else None


def add_to_hub_cache(folder: str | os.PathLike, repo_id: str, cache_dir: str | os.PathLike | None = None) -> str:
    """Lay out a model folder you built yourself (save_pretrained of a base you pre-trained, a diffusers pipeline,
    a timm or sentence-transformers folder) in the hub cache as
    huggingface_hub lays out a download: `blobs/<sha256>`, `snapshots/<commit>/<file>` linking to them, and
    `refs/main`. An adapter trained on `from_pretrained(repo_id, cache_dir=...)` then pins `repo_id` at that commit
    (IV501/IV502), and a reviewer's reload finds it offline. The commit is derived from the files (sha1 of their
    sorted names and sha256), so the same files give the same pin. Returns the commit."""
    import hashlib
    import tempfile

    if not isinstance(repo_id, str) or not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*", repo_id) \
            or ".." in repo_id:
        raise RecordError(f"{repo_id!r} is not a hub id (org/name): name the base as the adapter will pin it")
    source = Path(folder)
    files = sorted(p for p in source.rglob("*") if p.is_file() and not p.is_symlink())
    identity = on_disk(source)
    if identity is None or identity.kind not in BASE_KINDS:
        found = f" ({identity.what})" if identity is not None else ""
        raise RecordError(f"{source}: not a model or pipeline folder{found}: no config.json with weights, "
                          "model_index.json or modules.json; save it with save_pretrained (a transformers model, a "
                          "diffusers pipeline, a timm model) or SentenceTransformer.save first")
    if cache_dir is not None:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)  # a new cache for the campaign is fine
    digests = {p.relative_to(source).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    commit = hashlib.sha1("".join(f"{name} {digests[name]}\n" for name in sorted(digests)).encode()).hexdigest()
    repo = repo_folder(repo_id, cache_dir)
    snapshot = repo / "snapshots" / commit

    def replace(path: Path, write) -> None:  # never a half-written file where a reader may look
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = Path(tempfile.mkdtemp(dir=path.parent, prefix=".itera-")) / path.name
        write(temp)
        os.replace(temp, path)
        temp.parent.rmdir()

    for name, digest in digests.items():
        blob = repo / "blobs" / digest
        if not blob.is_file():
            replace(blob, lambda temp, name=name: temp.write_bytes((source / name).read_bytes()))
        link = snapshot / name
        replace(link, lambda temp, blob=blob, link=link: temp.symlink_to(os.path.relpath(blob, link.parent)))
    replace(repo / "refs" / "main", lambda temp: temp.write_text(commit))
    return commit
