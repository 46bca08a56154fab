"""Progress while the reload processes' libraries are imported (issue 25): the 8-12 s the zygote spends importing
torch, transformers and peft are said ("importing … once, for the reload processes"), and the first time estimate
is paced from the end of that wait, not spread over every artifact (it was 4-6x too high)."""
from __future__ import annotations

import pytest
import io
import re
import time

from itera_verify.cli.progress import LinesProgress

from tests.helpers import run_cli


def test_the_first_estimate_leaves_the_import_out():
    stream = io.StringIO()
    progress = LinesProgress(stream)
    progress.start("reload", "reloading artifacts", total=4, unit="artifacts")
    progress.waiting("reload", "importing torch, transformers, peft… once, for the reload processes")
    time.sleep(1.5)  # the import
    progress.waiting("reload", None)
    progress.began("reload", "a")
    time.sleep(0.1)  # one artifact's reload
    progress.advance("reload")
    lines = stream.getvalue().splitlines()
    assert lines[1] == "reloading artifacts: importing torch, transformers, peft… once, for the reload processes"
    assert re.fullmatch(r"reloading artifacts: ready after 1\.\d s", lines[2]), lines
    # 3 artifacts left at 0.1 s each; spread over the import it said "about 5 s left".
    assert lines[-1].startswith("reloading artifacts: 1/4 artifacts") and lines[-1].endswith("under 1 s left"), lines


def test_a_short_wait_is_not_a_line():
    stream = io.StringIO()
    progress = LinesProgress(stream)
    progress.start("reload", "reloading artifacts", total=2, unit="artifacts")
    progress.waiting("reload", "importing torch… once, for the reload processes")
    progress.waiting("reload", None)  # the zygote was ready already: its imports overlapped the static checks
    assert "ready after" not in stream.getvalue()


@pytest.mark.slow
def test_the_command_line_says_it_imports_before_the_first_artifact(package_dir, hf_cache):
    result = run_cli(package_dir, "--no-seal", "--hf-cache", hf_cache, "--select", "IV5")  # the reload's codes
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    started = lines.index("reloading artifacts: started (4 artifacts)")
    importing = lines.index("reloading artifacts: importing torch, transformers, peft… once, for the reload "
                            "processes")
    first = next(i for i, line in enumerate(lines) if re.match(r"reloading artifacts: \S+ started \(1 of 4", line))
    assert started < importing < first, result.stderr
