"""OpenSSF model-signing (OMS) signatures: `--sign model-signing:KEY.pem` (docs/format.md, OpenSSF model signing).

The seal writes `SEAL/model.sig` (format/names.py OMS_SIGNATURE), a Sigstore bundle made by the `model-signing`
library's `key` method (a local EC private key: nothing is sent anywhere), over every other regular file of the
extracted `<campaign_id>/` folder: the package's files and SEAL/ (SHA256SUMS, the report). A seal signed with an
SSH key too makes this signature first and its signed statement next, binding model.sig's digest: the statement
pair is then left out here, so that every member is covered by the SSH signer (format/statement.py). So the
reviewer's `model_signing verify key <campaign_id> --signature <campaign_id>/SEAL/model.sig --public_key
PUB.pem` accepts the extracted folder as it is (with `--allow_symlinks` when the package holds links).

Nothing is read twice: the manifest is built from the digests the seal's pass computed (SHA-256, the library's
default `files` serialization), not by the library walking the folder. What the signature leaves out, it says in
its signed `ignore_paths`, which the library's verifier applies: itself, the package's symbolic links (the library
would hash their targets under the link's name, and Python versions differ on following links to folders; the
targets are covered where they are), and the git paths the library ignores by default at the top.

The library is optional (`pip install 'itera-verify[model-signing]'`) and imported only here. model-signing 1.1.1
imports pyOpenSSL (`OpenSSL.crypto`, for its certificate method) without declaring it: the extra adds it.
"""
from __future__ import annotations

import hashlib
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Iterable

from ..format.names import OMS_SIGNATURE, STATEMENT, STATEMENT_SIG
from ..model import UsageError

EXTRA = "pip install 'itera-verify[model-signing]'"
# model_signing.hashing.Config ignores these at the model's top unless told otherwise (--no-ignore-git-paths).
GIT_PATHS = (".git", ".gitattributes", ".github", ".gitignore")
KEY_FILE_MAX = 1 << 20


def library():
    """The modules this needs, or UsageError (exit 2) naming the extra."""
    try:
        from model_signing import manifest
        from model_signing._hashing.hashing import Digest
        from model_signing._signing import sign_ec_key, sign_sigstore_pb, signing
    except ImportError as exc:
        missing = exc.name or "model_signing"
        raise UsageError(f"model-signing signatures need the model-signing library ({missing} is not installed): "
                         f"{EXTRA}") from None
    return manifest, Digest, sign_ec_key, sign_sigstore_pb, signing


def _ignored(rel: str, ignore: Iterable[str]) -> bool:
    # as model_signing's serialization.should_ignore: a path under an ignored one is ignored (lexically)
    return any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in ignore)


def ignore_paths(files: Iterable[str], links: Iterable[str], statement: bool = False) -> list[str]:
    """What an OMS signature over a package with these files and links says it leaves out; `statement`: the seal
    is SSH-signed too, and its statement pair, made after this signature and binding it, is left out."""
    present = {rel.split("/", 1)[0] for rel in files} | {rel.split("/", 1)[0] for rel in links}
    pair = [STATEMENT, STATEMENT_SIG] if statement else []
    return [OMS_SIGNATURE, *pair, *sorted(links), *(p for p in GIT_PATHS if p in present)]


def covered(digests: dict[str, str], ignore: Iterable[str]) -> dict[str, str]:
    """The files (path under the top folder -> sha256) an OMS signature with `ignore` covers."""
    ignore = [*ignore, OMS_SIGNATURE, *GIT_PATHS]  # the verifier's own additions (the --signature path, git)
    return {rel: digest for rel, digest in digests.items() if not _ignored(rel, ignore)}


def key_hint(public_pem: bytes) -> str:
    """How the bundle names its key (`verificationMaterial.publicKey.hint`): the SHA-256 of its PEM."""
    return hashlib.sha256(public_pem).hexdigest()


@dataclass
class OmsSigner:
    path: Path
    hint: str
    _signer: object = field(repr=False)

    def members(self, campaign_id: str, digests: dict[str, str], links: Iterable[str],
                statement: bool = False) -> dict[str, bytes]:
        """SEAL/model.sig over `digests` (every other regular file of the folder but the statement pair, which
        `statement` says the seal writes next: path -> sha256)."""
        manifest, Digest, _, _, signing = library()
        ignore = ignore_paths(digests, links, statement)
        items = [manifest.FileManifestItem(path=PurePosixPath(rel), digest=Digest("sha256", bytes.fromhex(sha)))
                 for rel, sha in sorted(covered(digests, ignore).items())]
        serialization = manifest._FileSerialization("sha256", True, [PurePosixPath(p) for p in ignore])
        payload = signing.Payload(manifest.Manifest(campaign_id, items, serialization))
        return {OMS_SIGNATURE: self._signer.sign(payload).bundle.to_json().encode("utf-8")}

    def describe(self, campaign_id: str) -> dict:
        return {"path": f"{campaign_id}/{OMS_SIGNATURE}", "key": f"sha256:{self.hint}",
                "source": f"private key file {self.path.name}"}


def open_oms_signer(spec: str, path: Path) -> OmsSigner:
    """The EC private key (P-256, P-384 or P-521, unencrypted PEM) at `path`; UsageError for anything else."""
    _, _, sign_ec_key, _, _ = library()
    from cryptography.hazmat.primitives import serialization  # model-signing's own dependency

    try:
        signer = sign_ec_key.Signer(path, None)
    except OSError as exc:
        raise UsageError(f"--sign {spec}: cannot read the key ({exc.strerror or exc})") from None
    except TypeError:  # cryptography: a password is needed
        raise UsageError(f"--sign {spec}: the key is encrypted; model-signing signs with an unencrypted EC key "
                         "(PEM)") from None
    except (ValueError, AttributeError) as exc:
        raise UsageError(f"--sign {spec}: not an EC private key model-signing can use (P-256, P-384 or P-521, "
                         f"PEM): {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    public = signer._private_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    return OmsSigner(path, key_hint(public), signer)


# ---- the audit's check -------------------------------------------------------------------------------------
def read_public_key(path: Path) -> bytes:
    """The reviewer's --oms-public-key, checked before the archive is read: exit 2 when it cannot be used."""
    library()
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        with open(path, "rb") as fh:
            data = fh.read(KEY_FILE_MAX + 1)
    except OSError as exc:
        raise UsageError(f"--oms-public-key {path}: cannot read ({exc.strerror or exc})") from None
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        raise UsageError(f"--oms-public-key {path}: not a PEM public key (`openssl ec -in KEY.pem -pubout`)") \
            from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise UsageError(f"--oms-public-key {path}: not an EC public key (model-signing's key method uses EC keys)")
    return data


# A Sigstore bundle in JSON (sigstore protobuf-specs `Bundle`): its media type, its verification material and one
# content, nothing else. What model-signing writes; the shape is checked without the library.
BUNDLE_MEDIA_TYPE = re.compile(r"application/vnd\.dev\.sigstore\.bundle(\.v0\.[0-9]+\+json|\+json;version=0\.[0-9]+)")
BUNDLE_CONTENTS = ("dsseEnvelope", "messageSignature")
BUNDLE_KEYS = frozenset({"mediaType", "verificationMaterial", *BUNDLE_CONTENTS})


def bundle_problem(bundle: bytes) -> str | None:
    """Why `bundle` is not a JSON Sigstore bundle (SEAL/model.sig must be one), or None."""
    from ..package.jsonread import read_json

    try:
        parsed = read_json(bundle)
    except ValueError as exc:  # JSONLimitError, JSONDecodeError, UnicodeDecodeError
        return f"not a JSON Sigstore bundle ({str(exc).splitlines()[0][:120] if str(exc) else 'not JSON'})"
    if not isinstance(parsed, dict):
        return "not a JSON Sigstore bundle (not a JSON object)"
    unknown = sorted(k[:40] for k in set(parsed) - BUNDLE_KEYS)
    media = parsed.get("mediaType")
    contents = [k for k in BUNDLE_CONTENTS if isinstance(parsed.get(k), dict)]
    if unknown or not isinstance(media, str) or not BUNDLE_MEDIA_TYPE.fullmatch(media) or \
            not isinstance(parsed.get("verificationMaterial"), dict) or len(contents) != 1 or \
            any(k in parsed for k in BUNDLE_CONTENTS if k not in contents):
        why = (f"keys a bundle does not have: {', '.join(unknown[:5])}" if unknown else
               f"mediaType {str(media)[:80]!r}" if not isinstance(media, str) or not BUNDLE_MEDIA_TYPE.fullmatch(media)
               else "no verificationMaterial object" if not isinstance(parsed.get("verificationMaterial"), dict)
               else "not exactly one of dsseEnvelope and messageSignature")
        return f"not a JSON Sigstore bundle ({why})"
    return None


def check(bundle: bytes | None, public_key: Path | None, files: dict[str, str]) -> dict:
    """The audit's facts on SEAL/model.sig: `state` absent | valid | invalid | unchecked, and why. `files`: every
    regular file of the archive under its top folder -> the sha256 the audit computed from its stream. Anything
    that is not a JSON Sigstore bundle is invalid, with or without the key."""
    if bundle is None:
        return {"state": "absent", "required": public_key is not None}
    problem = bundle_problem(bundle)
    if problem is not None:
        return {"state": "invalid", "problem": problem}
    if public_key is None:
        return {"state": "unchecked", "problem": "no --oms-public-key given: run `model_signing verify key` on the "
                                                 "extracted folder with the sender's public key"}
    manifest_module, _, sign_ec_key, sign_sigstore_pb, _ = library()
    with tempfile.TemporaryDirectory(prefix="itera-oms-") as folder:  # the library reads a signature from a file
        copy = Path(folder) / "model.sig"
        copy.write_bytes(bundle)
        try:
            signature = sign_sigstore_pb.Signature.read(copy)
            expected = sign_ec_key.Verifier(public_key).verify(signature)
        except Exception as exc:  # noqa: BLE001 - the library raises what the bundle provokes: all say "invalid"
            return {"state": "invalid", "problem": _first_line(exc)}
    facts = {"key": f"sha256:{key_hint(public_key.read_bytes())}"}
    serialization = expected.serialization_type
    if serialization.get("method") != "files" or serialization.get("hash_type") != "sha256":
        return {**facts, "state": "unchecked", "problem": (
            f"signed with {serialization.get('method')}/{serialization.get('hash_type')} hashing, which this audit "
            "does not recompute: run `model_signing verify key` on the extracted folder")}
    signed = {rd.identifier: rd.digest.digest_hex for rd in expected.resource_descriptors()}
    present = covered(files, [str(p) for p in serialization.get("ignore_paths", ())])
    problems = [f"{rel}: content differs from the signed digest" for rel in sorted(signed.keys() & present.keys())
                if signed[rel] != present[rel]]
    problems += [f"{rel}: signed but missing from the archive" for rel in sorted(signed.keys() - present.keys())]
    problems += [f"{rel}: in the archive but not signed" for rel in sorted(present.keys() - signed.keys())]
    if problems:
        return {**facts, "state": "invalid", "problem": "; ".join(problems[:5]) + (
            f"; and {len(problems) - 5} more" if len(problems) > 5 else "")}
    return {**facts, "state": "valid", "files": len(signed)}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
