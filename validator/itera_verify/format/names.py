"""The names of the `itera-output/1` format: its documents, the sealed archive's SEAL/ members, the id and hub-id
patterns, the file suffixes read as pickles. Every stage spells them from here."""
from __future__ import annotations

import re
import unicodedata

# The package's documents (docs/format.md, loaders).
MANIFEST, STOPS, RELOAD = "manifest.json", "stops.json", "reload.json"
EVAL_IDS = "corpus/eval_ids.txt"  # where the recorder writes the frozen eval ids

# The sealed archive's own folder and members (docs/format.md, the sealed archive): the seal writes them, the
# audit reads them.
SEAL_DIR = "SEAL"
SUMS = f"{SEAL_DIR}/SHA256SUMS"
RECORD = f"{SEAL_DIR}/verification.json"
REPORT_PAGE = f"{SEAL_DIR}/report.html"
# A signed seal's statement and its signature (format/statement.py): never listed in SHA256SUMS, whose digest the
# statement holds. The archive's own signature is `<archive>` + ARCHIVE_SIG_SUFFIX beside it.
STATEMENT = f"{SEAL_DIR}/statement.json"
STATEMENT_SIG = f"{SEAL_DIR}/statement.json.sig"
# An OpenSSF model-signing (OMS) signature (`--sign model-signing:KEY.pem`, seal/oms.py): a Sigstore bundle over
# every other regular file of the extracted folder, SEAL/ included; never listed in SHA256SUMS either.
OMS_SIGNATURE = f"{SEAL_DIR}/model.sig"
SIGNATURE_MEMBERS = (STATEMENT, STATEMENT_SIG, OMS_SIGNATURE)
ARCHIVE_SIG_SUFFIX = ".sig"
# An extracted package holds both a manifest and SEAL/: either one marks a folder as the sender's.
PACKAGE_MARKS = (MANIFEST, SEAL_DIR)

# Run ids, artifact ids and campaign_id: safe as file and archive names (docs/format.md, IV105).
ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# A Hugging Face hub id: `name` or `org/name`.
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
# A pinned revision: a 40-hex commit (IV501); a branch or tag name is not a pin.
PINNED_REVISION = re.compile(r"[0-9a-f]{40}")

# A hub-cache snapshot folder, <cache>/models--ORG--NAME/snapshots/<commit>[/subfolder]: what diffusers (and
# transformers) record as a saved component's `_name_or_path` when the base was loaded from the hub.
HUB_SNAPSHOT = re.compile(r".*/models--(?P<repo>[^/]+)/snapshots/(?P<revision>[^/]+)(?:/(?P<sub>[^/].*?))?/?")
NAME_OR_PATH = "_name_or_path"


def snapshot_repo(value: str) -> tuple[str, str, str | None] | None:
    """(hub id, revision, subfolder) of a hub-cache snapshot path, or None for another value."""
    match = HUB_SNAPSHOT.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        return None
    return match.group("repo").replace("--", "/", 1), match.group("revision"), match.group("sub")


# Suffixes of files torch, pickle and joblib users read with an unpickler (docs/format.md: scanned by name or content).
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle")


# The metric lines `run.inputs(split, total, truncated)` writes and the `truncated_input` rule reads (docs/record.md).
def inputs_metric(count: str, split: str) -> str:
    """`inputs_total/<split>` or `inputs_truncated/<split>` (count: "total" or "truncated")."""
    return f"inputs_{count}/{split}"


def folded(name: str) -> str:
    """A name as a case-insensitive, normalisation-insensitive disk (APFS, NTFS) compares it: two names that fold
    alike are one file there (IV206, and the audit's IV703)."""
    return unicodedata.normalize("NFC", name).casefold()
