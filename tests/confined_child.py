"""What the confinement tests share: a forked child confined exactly as a reload child confines itself, and the
errno of each thing it tries (tests/test_confined_reloads.py, test_confined_sockets.py, test_redteam4_confine.py)."""
from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest

from itera_verify.reload.child import cut_network
from itera_verify.reload.confine import confine_child, recorded
from itera_verify.runtime.launcher import Forked


def attempt(action) -> str:
    """'ok', or the errno's name of the refusal."""
    try:
        action()
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return "ok"


def confined(tmp_path: Path, job: dict, tries, env: dict | None = None, *, cut: bool = True) -> tuple[str, dict]:
    """Fork; the child takes `env` as its variables (when given), confines itself as a reload child (its scratch
    folder, `job`), cuts its network as a reload child does (`cut`), then runs `tries(scratch)`. (what the child
    recorded as held, what tries returned)."""
    scratch = tempfile.mkdtemp(prefix="itera-reload-", dir=tmp_path)

    def child():
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        confine_child(dict({"device": "cpu", "confine": "auto"}, **job), scratch)
        if cut:
            cut_network()
        return tries(Path(scratch))

    outcome = Forked(child).result()
    return recorded(scratch), outcome


@pytest.fixture
def package(tmp_path) -> Path:
    """A package folder holding one small file, for the child to read and fail to write."""
    root = tmp_path / "package"
    (root / "artifacts").mkdir(parents=True)
    (root / "artifacts/model.safetensors").write_bytes(b"weights")
    return root
