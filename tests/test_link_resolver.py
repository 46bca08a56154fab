"""archive/links.py, the one resolver of symbolic links: the same answer as os.path.realpath and the kernel on
real folders of links, without realpath's recursion or its cost in the square of a chain's length."""
from __future__ import annotations

import errno
import os
import random
import time

import pytest

from itera_verify.archive.links import MAX_HOPS, LinkResolver, real_path


def kernel_says_eloop(path: str) -> bool:
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno == errno.ELOOP
    return False


def random_tree(root: str, rng: random.Random) -> list[str]:
    """Folders, files and links (relative, absolute, climbing, looping, dangling) under `root`; their names."""
    made = [""]
    for i in range(rng.randint(2, 14)):
        folders = [p for p in made if os.path.isdir(os.path.join(root, p)) and not os.path.islink(os.path.join(root, p))]
        rel = os.path.join(rng.choice(folders), f"{rng.choice('abcd')}{i}")
        path = os.path.join(root, rel)
        kind = rng.random()
        if kind < 0.3:
            os.mkdir(path)
        elif kind < 0.45:
            open(path, "w").close()
        else:
            targets = ["..", ".", "../..", root, "/etc", "missing/x"]
            targets += [os.path.relpath(os.path.join(root, p), os.path.dirname(path)) for p in made]
            target = rng.choice(targets) + rng.choice(["", "", "/..", "/x", "/."])
            os.symlink(target, path)
        made.append(rel)
    return made


@pytest.mark.parametrize("seed", range(6))
def test_every_path_of_a_random_folder_of_links_resolves_as_realpath_and_the_kernel_say(tmp_path, seed):
    rng = random.Random(seed)
    for trial in range(40):
        root = os.path.realpath(tmp_path / f"t{trial}")
        os.mkdir(root)
        resolver = LinkResolver()
        for rel in random_tree(root, rng):
            for tail in ("", "/..", "/x", "/../..", "/./y/.."):
                path = os.path.join(root, rel) + tail
                resolved = resolver.resolve(path)
                if resolved.looped:
                    assert kernel_says_eloop(path), path
                else:
                    assert not kernel_says_eloop(path), path
                    assert resolved.path == os.path.realpath(path), path


@pytest.mark.parametrize("length, looped", [(MAX_HOPS - 1, False), (MAX_HOPS, False), (MAX_HOPS + 1, True)])
def test_a_chain_is_followed_to_the_kernels_limit_and_no_further(tmp_path, length, looped):
    for i in range(length):
        os.symlink(f"{i + 1:04d}", tmp_path / f"{i:04d}")
    (tmp_path / f"{length:04d}").write_text("end\n")
    assert LinkResolver().resolve(tmp_path / "0000").looped is looped
    assert kernel_says_eloop(str(tmp_path / "0000")) is looped


def test_a_link_loop_is_looped_and_not_an_endless_walk(tmp_path):
    os.symlink("b/x", tmp_path / "a")
    os.symlink("a", tmp_path / "b")
    assert LinkResolver().resolve(tmp_path / "a").looped and kernel_says_eloop(str(tmp_path / "a"))
    assert real_path(tmp_path / "a") == str(tmp_path / "a")  # as written: opening it fails with ELOOP


@pytest.mark.slow
def test_every_link_of_a_chain_of_20000_costs_one_look_up(tmp_path):
    """os.path.realpath of each link of this chain walks the rest of it (200 million steps; Python 3.11 also
    recurses once per link, RecursionError at about 1,000)."""
    length = 20_000
    for i in range(length):
        os.symlink(f"{i + 1:05d}", tmp_path / f"{i:05d}")
    (tmp_path / f"{length:05d}").write_text("end\n")
    started = time.process_time()
    resolver = LinkResolver()
    results = [resolver.resolve(tmp_path / f"{i:05d}") for i in range(length)]
    assert sum(r.looped for r in results) == length - MAX_HOPS
    assert results[-1].path == str(tmp_path / f"{length:05d}")
    assert time.process_time() - started < 10
