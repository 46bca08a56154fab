"""The reviewer's own key: what authenticates the records a reviewer's runs leave for its later runs.

Two such records are read back as input by a later run, and whoever can write where they lie could forge them:
a stored audit result (`audit --results`, flows/batch_results.py), which turns into a verdict without an audit,
and the record `assemble` keeps of the parts it audited (flows/assemble_record.py), which lets a lot's signed
reload proof stand for an artifact. Each carries an HMAC-SHA256 made with this key, over its exact bytes and a
purpose (so a record of one kind is never taken for the other). Without the key nobody makes a valid one.

The key is a file, `$XDG_CONFIG_HOME/itera-verify/results.key` (else `~/.config/itera-verify/results.key`),
created on first use: 32 random bytes in hex, mode 0600, in a folder of mode 0700. `--results-key FILE` or
`ITERA_RESULTS_KEY=FILE` names another, which must exist (shards on several machines share one key: a shared
home, a Kubernetes Secret, a CI secret written to a file). A key that every user may read, or its group may
write, is refused: it would not be the reviewer's alone (its group may read it: a Secret mounted for a pod's
fsGroup is).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path

from ..model import UsageError
from .environment import Environment

KEY_FOLDER, KEY_NAME = "itera-verify", "results.key"
KEY_MIN_BYTES = 32  # what the key file holds at least, once stripped (a made one holds 64 hex characters)
KEY_READ_MAX = 4096
MAKE_ONE = "python3 -c 'import secrets; print(secrets.token_hex(32))' > FILE; chmod 600 FILE"


def default_key_file(environment: Environment) -> Path:
    return environment.config_home / KEY_FOLDER / KEY_NAME


def reviewer_key(explicit: Path | None, environment: Environment, *, create: bool) -> bytes | None:
    """The key's bytes: from `explicit` (it must exist), else from the default file, made there when `create`
    and missing (None when not `create` and missing). UsageError (exit 2) when it cannot be read or made, or
    when every user may read it."""
    path = explicit if explicit is not None else default_key_file(environment)
    try:
        return _read(path)
    except FileNotFoundError:
        if explicit is not None:
            raise UsageError(f"--results-key {path}: no such file (make one: {MAKE_ONE})") from None
        if not create:
            return None
    _make(path)
    return _read(path)


def _read(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise UsageError(f"{path}: the results key cannot be read ({exc.strerror or exc}; a link is never "
                         "followed)") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"{path}: the results key is not a regular file")
        if info.st_mode & (stat.S_IROTH | stat.S_IWOTH | stat.S_IWGRP):
            raise UsageError(f"{path}: the results key may be read or written by other users (mode "
                             f"{stat.S_IMODE(info.st_mode):04o}): chmod 600 {path}")
        data = os.read(fd, KEY_READ_MAX + 1)
    finally:
        os.close(fd)
    key = data.strip()
    if len(data) > KEY_READ_MAX or len(key) < KEY_MIN_BYTES:
        raise UsageError(f"{path}: not a results key ({KEY_MIN_BYTES} to {KEY_READ_MAX} bytes; make one: "
                         f"{MAKE_ONE})")
    return key


def _make(path: Path) -> None:
    """Write a new key without ever replacing one: under a private name, then linked to its name (another
    process that made one first wins, and both read the same)."""
    try:
        path.parent.parent.mkdir(parents=True, exist_ok=True)
        path.parent.mkdir(mode=0o700, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, (secrets.token_hex(32) + "\n").encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(partial, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(partial)
    except OSError as exc:
        raise UsageError(f"{path}: the results key cannot be made ({exc.strerror or exc})") from None


MAC_FIELD = "hmac_sha256"  # the member of an authenticated record that holds its MAC


def canonical(value) -> bytes:
    """The one spelling of a record its MAC covers: written so, and spelled so again from what is read."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False,
                      default=str).encode("ascii")


def authenticated(key: bytes, purpose: str, record: dict) -> bytes:
    """`record` as JSON bytes, with its MAC beside its members (a JSON object still)."""
    body = canonical(record)
    if not record or MAC_FIELD in record:
        raise ValueError(f"an authenticated record has members, and none named {MAC_FIELD}")
    return body[:-1] + f',"{MAC_FIELD}":"{mac(key, purpose, body)}"}}'.encode("ascii")


def authentic_record(key: bytes | None, purpose: str, value) -> dict | None:
    """The record (as parsed from what `authenticated` wrote), without its MAC, when the MAC is this key's;
    else None. Nothing without the key passes: not a record edited, nor one of another purpose."""
    if not isinstance(value, dict):
        return None
    record = {name: member for name, member in value.items() if name != MAC_FIELD}
    try:
        body = canonical(record)
    except ValueError:
        return None
    return record if authentic(key, purpose, body, value.get(MAC_FIELD)) else None


def mac(key: bytes, purpose: str, data: bytes) -> str:
    """HMAC-SHA256 of `data` for `purpose` (a record's format name), in hex."""
    return hmac.new(key, purpose.encode("ascii") + b"\n" + data, hashlib.sha256).hexdigest()


def authentic(key: bytes | None, purpose: str, data: bytes, claimed) -> bool:
    return key is not None and isinstance(claimed, str) and claimed.isascii() and \
        hmac.compare_digest(mac(key, purpose, data), claimed)


__all__ = ["MAC_FIELD", "authentic", "authentic_record", "authenticated", "canonical", "default_key_file", "mac",
           "reviewer_key"]
