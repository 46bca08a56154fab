"""Where `-o` puts the archive, read once for the workflow and the command line.

- none: `<campaign_id>.tar.zst` in the package's parent folder (never inside the package);
- a folder: a path ending in `/`, or one that is an existing folder: `<campaign_id>.tar.zst` inside it. A missing
  folder is created when the seal starts, its last component only: a missing parent is exit 2 (a typo in a
  parent should not build a tree of folders somewhere);
- a file: a path ending in `.tar.zst`, written under that name (its folder must exist);
- anything else (`-o sealed`, no slash, no such folder, no `.tar.zst`) is exit 2 naming both spellings: a file
  named `sealed` holding zstd data is what a user who meant the folder got, and what a reviewer cannot open.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..model import UsageError
from ..package import inside_package, shortened

ARCHIVE_SUFFIX = ".tar.zst"


@dataclass(frozen=True)
class Output:
    folder: Path
    file_name: str | None  # None: <campaign_id>.tar.zst
    create: bool  # the folder does not exist yet: made when the seal starts

    def archive(self, campaign_id: str) -> Path:
        return self.folder / (self.file_name or f"{campaign_id}{ARCHIVE_SUFFIX}")


def read_output(package_root: str | os.PathLike, output: str | os.PathLike | None) -> Output:
    """What `-o` names; UsageError (exit 2) for one that cannot work, before anything is written."""
    if output is None:
        return Output(Path(package_root).resolve().parent, None, False)
    text = os.fspath(output)
    path = Path(text)
    if text.endswith(("/", os.sep)) or path.is_dir():
        if path.is_dir():
            return Output(path, None, False)
        if path.exists() or path.is_symlink():
            raise UsageError(f"-o {shortened(text)}: exists and is not a folder")
        if not path.parent.is_dir():
            raise UsageError(f"-o {shortened(text)}: no such folder {shortened(str(path.parent))} (only the last "
                             f"folder of -o is created)")
        if inside_package(package_root, path):
            raise UsageError(f"-o {shortened(text)}: the archive cannot be written inside the package folder")
        return Output(path, None, True)
    if not text.endswith(ARCHIVE_SUFFIX):
        raise UsageError(f"-o {shortened(text)}: neither a folder nor a {ARCHIVE_SUFFIX} file: write "
                         f"'{shortened(text)}/' for a folder (created if missing) or '{shortened(text)}"
                         f"{ARCHIVE_SUFFIX}' for a file")
    return Output(path.parent, path.name, False)


def archive_destination(package_root: str | os.PathLike, campaign_id: str, output: str | os.PathLike | None, *,
                        create: bool) -> Path:
    """The archive's path for `-o output`; `create`: make the folder `-o DIR/` names when it is missing."""
    target = read_output(package_root, output)
    if create and target.create:
        try:
            target.folder.mkdir()
        except FileExistsError:
            pass  # made meanwhile: the seal's own checks look at what it is
        except OSError as exc:
            raise UsageError(f"-o {shortened(os.fspath(output))}: cannot create the folder "
                             f"({exc.strerror or exc})") from exc
    return target.archive(campaign_id)
