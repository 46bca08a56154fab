"""OpenSSH signatures as bytes, in one place: public keys, the SSHSIG format (`ssh-keygen -Y sign`, OpenSSH's
PROTOCOL.sshsig), its verification, and the reviewer's `allowed_signers` file (ssh-keygen(1), ALLOWED SIGNERS).

The seal writes signatures with these functions (the agent signs what `signed_data` returns) and checks each one
before it publishes; the audit reads and verifies them with the same functions. Every reading follows OpenSSH 9's
(sshsig.c, sshkey.c, sshbuf-getput-crypto.c), so that what the audit accepts is what `ssh-keygen -Y verify`
accepts: the armor starts with its BEGIN line, the blob's version is at most 1 and nothing trails it, the
reserved field is not signed, the hash is sha256 or sha512, an RSA signature is rsa-sha2-256 or rsa-sha2-512.
Supported keys: ssh-ed25519, ecdsa-sha2-nistp256/384/521, ssh-rsa. Certificates and security keys (sk-*) are
refused as unsupported; an allowed_signers line marked cert-authority therefore never admits a signature.
"""
from __future__ import annotations

import base64
import binascii
import calendar
import hashlib
import re
import struct
import time
from dataclasses import dataclass, field
from typing import Callable

from .sshcrypto import CURVES, ec_point, ecdsa_verify, ed25519_verify, rsa_key_problem, rsa_verify

MAGIC = b"SSHSIG"
VERSION = 1
BEGIN, END = b"-----BEGIN SSH SIGNATURE-----\n", b"-----END SSH SIGNATURE-----"
HASHES = ("sha256", "sha512")
RSA_SIGNATURES = {"rsa-sha2-256": "sha256", "rsa-sha2-512": "sha512"}
KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")
MAX_BIGNUM = 16384 // 8  # OpenSSH's SSHBUF_MAX_BIGNUM
MAX_SIGNATURE_FILE = 64 << 10  # far above any supported key's armored signature (RSA-16384: under 6 KiB)


class SshSigError(ValueError):
    """A signature or key that cannot be read, or that does not verify; the message says which, in a line."""


# ---- the SSH wire format (RFC 4251 §5) ----------------------------------------------------------------------
def string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def mpint(value: int) -> bytes:
    """A non-negative number as OpenSSH writes it: big-endian, minimal, a 0 byte first when the top bit is set."""
    return string(value.to_bytes((value.bit_length() + 8) // 8, "big") if value else b"")


class _Reader:
    def __init__(self, data: bytes, what: str):
        self.data, self.pos, self.what = data, 0, what

    def u32(self) -> int:
        if self.pos + 4 > len(self.data):
            raise SshSigError(f"{self.what} is cut short")
        self.pos += 4
        return struct.unpack(">I", self.data[self.pos - 4:self.pos])[0]

    def string(self) -> bytes:
        size = self.u32()
        if self.pos + size > len(self.data):
            raise SshSigError(f"{self.what} is cut short")
        self.pos += size
        return self.data[self.pos - size:self.pos]

    def cstring(self) -> bytes:
        value = self.string()
        if b"\0" in value:
            raise SshSigError(f"{self.what} holds a NUL byte in a name")
        return value

    def mpint(self) -> int:
        value = self.string()
        if value and value[0] & 0x80:
            raise SshSigError(f"{self.what} holds a negative number")
        if len(value) > MAX_BIGNUM + 1 or (len(value) == MAX_BIGNUM + 1 and value[0]):
            raise SshSigError(f"{self.what} holds a number too large")
        return int.from_bytes(value, "big")

    def end(self) -> None:
        if self.pos != len(self.data):
            raise SshSigError(f"{self.what} has trailing data")


def _text(value: bytes) -> str:
    return value.decode("utf-8", "backslashreplace")


# ---- public keys --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PublicKey:
    algorithm: str  # ssh-ed25519 | ecdsa-sha2-nistp256 | ... | ssh-rsa
    blob: bytes  # the key in the wire format as OpenSSH writes it; two keys are the same key when their blobs are equal
    params: tuple = field(compare=False, repr=False)

    @property
    def fingerprint(self) -> str:
        """As `ssh-keygen -l` shows it: SHA256:<base64 without padding>."""
        return "SHA256:" + base64.b64encode(hashlib.sha256(self.blob).digest()).decode().rstrip("=")

    @property
    def openssh(self) -> str:
        """The key as one line of an authorized_keys or allowed_signers file (without a comment)."""
        return f"{self.algorithm} {base64.b64encode(self.blob).decode()}"

    @property
    def bits(self) -> int:
        if self.algorithm == "ssh-rsa":
            return self.params[1].bit_length()
        return 256 if self.algorithm == "ssh-ed25519" else int(self.algorithm[-3:])


def parse_public_key(blob: bytes) -> PublicKey:
    """A public key blob as OpenSSH decodes it. SshSigError for a malformed or unsupported key."""
    reader = _Reader(blob, "the public key")
    algorithm = _text(reader.cstring())
    if algorithm == "ssh-ed25519":
        public = reader.string()
        if len(public) != 32:
            raise SshSigError("the ed25519 public key is not 32 bytes")
        params: tuple = (public,)
    elif algorithm.startswith("ecdsa-sha2-") and algorithm[11:] in CURVES:
        curve = CURVES[algorithm[11:]]
        if _text(reader.cstring()) != curve.name:
            raise SshSigError("the ECDSA key's curve does not match its type")
        point = ec_point(curve, reader.string())
        if point is None:
            raise SshSigError(f"the {curve.name} public key is not a valid point")
        params = (curve, point)
    elif algorithm == "ssh-rsa":
        e, n = reader.mpint(), reader.mpint()
        problem = rsa_key_problem(e, n)
        if problem:
            raise SshSigError(problem)
        params = (e, n)
        # OpenSSH reads numbers with leading zero bytes, compares keys by value and fingerprints them written
        # again: the blob kept is the key as OpenSSH writes it.
        reader.end()
        return PublicKey(algorithm, string(b"ssh-rsa") + mpint(e) + mpint(n), params)
    else:
        raise SshSigError(f"unsupported key type {algorithm[:60]!r} (supported: {', '.join(KEY_TYPES)})")
    reader.end()
    return PublicKey(algorithm, bytes(blob), params)


def parse_public_key_text(text: str) -> PublicKey:
    """`TYPE BASE64 [comment]`, as in a `.pub` file. SshSigError when it is not one."""
    parts = text.strip().split(None, 2)
    if len(parts) < 2 or parts[0] not in KEY_TYPES:
        raise SshSigError("not an OpenSSH public key (expected 'ssh-ed25519 AAAA...', 'ecdsa-sha2-nistp256 ...' or "
                          "'ssh-rsa ...')")
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):  # ValueError: a non-ASCII character (base64 refuses it before decoding)
        raise SshSigError("the public key's base64 is malformed") from None
    key = parse_public_key(blob)
    if key.algorithm != parts[0]:
        raise SshSigError(f"the key says {parts[0]} but holds a {key.algorithm} key")
    return key


# ---- SSHSIG ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Signature:
    key: PublicKey
    namespace: bytes
    hash_algorithm: str
    signature: bytes  # the key's signature blob: string algorithm, string bytes


def signed_data(namespace: str | bytes, hash_algorithm: str, digest: bytes) -> bytes:
    """What the key signs: the preamble, the namespace, an empty reserved field, the hash name, H(message)."""
    namespace = namespace.encode() if isinstance(namespace, str) else namespace
    return MAGIC + string(namespace) + string(b"") + string(hash_algorithm.encode()) + string(digest)


def armor(key_blob: bytes, namespace: str, hash_algorithm: str, signature: bytes) -> bytes:
    """The armored SSHSIG file, as `ssh-keygen -Y sign` writes it (base64 lines of 70 characters)."""
    blob = (MAGIC + struct.pack(">I", VERSION) + string(key_blob) + string(namespace.encode()) + string(b"")
            + string(hash_algorithm.encode()) + string(signature))
    encoded = base64.b64encode(blob)
    lines = [encoded[i:i + 70] for i in range(0, len(encoded), 70)]
    return BEGIN + b"\n".join(lines) + b"\n" + END + b"\n"


def dearmor(data: bytes) -> bytes:
    if not data.startswith(BEGIN):
        raise SshSigError("not an SSH signature (no '-----BEGIN SSH SIGNATURE-----' line at its start)")
    end = data.find(b"\n" + END, len(BEGIN) - 1)
    if end < 0:
        raise SshSigError("the SSH signature has no END line")
    body = re.sub(rb"[ \t\n\r\v\f]", b"", data[len(BEGIN):end])
    try:
        return base64.b64decode(body, validate=True)
    except binascii.Error:
        raise SshSigError("the SSH signature's base64 is malformed") from None


def parse_signature(data: bytes) -> Signature:
    """An armored SSHSIG file, read as sshsig.c reads it. SshSigError when it cannot be."""
    reader = _Reader(dearmor(data), "the signature")
    if reader.data[:6] != MAGIC:
        raise SshSigError("the signature does not start with SSHSIG")
    reader.pos = 6
    version = reader.u32()
    if version > VERSION:
        raise SshSigError(f"signature version {version} (this reads version {VERSION})")
    key_blob = reader.string()
    namespace = reader.cstring()
    reader.string()  # reserved: not signed, and ignored by OpenSSH
    hash_algorithm = _text(reader.cstring())
    signature = reader.string()
    reader.end()
    if hash_algorithm not in HASHES:
        raise SshSigError(f"unsupported hash algorithm {hash_algorithm[:40]!r}")
    return Signature(parse_public_key(key_blob), namespace, hash_algorithm, signature)


def _key_verifies(key: PublicKey, signature: bytes, data: bytes) -> bool:
    reader = _Reader(signature, "the key's signature")
    algorithm = _text(reader.cstring())
    if key.algorithm == "ssh-rsa":
        if algorithm not in RSA_SIGNATURES:
            raise SshSigError(f"an RSA signature of type {algorithm[:40]!r} (rsa-sha2-256 or rsa-sha2-512 only)")
        raw = reader.string()
        reader.end()
        return rsa_verify(*key.params, RSA_SIGNATURES[algorithm], raw, data)
    if algorithm != key.algorithm:
        raise SshSigError(f"a {algorithm[:40]} signature from a {key.algorithm} key")
    raw = reader.string()
    reader.end()
    if key.algorithm == "ssh-ed25519":
        return ed25519_verify(key.params[0], raw, data)
    numbers = _Reader(raw, "the ECDSA signature")
    r, s = numbers.mpint(), numbers.mpint()
    numbers.end()
    return ecdsa_verify(key.params[0], key.params[1], r, s, data)


def verify(data: bytes, namespace: str, message: bytes | None = None,
           digest: Callable[[str], bytes] | None = None) -> Signature:
    """Check the armored signature `data` over `message` (or over the content whose hash `digest(name)` returns,
    name sha256 or sha512: an archive is not read twice) in `namespace`. Returns the signature (its key is the
    signer); SshSigError says why it does not verify."""
    parsed = parse_signature(data)
    if parsed.namespace != namespace.encode():
        raise SshSigError(f"signed in namespace {_text(parsed.namespace)[:60]!r}, not {namespace!r}")
    hashed = hashlib.new(parsed.hash_algorithm, message).digest() if digest is None else digest(parsed.hash_algorithm)
    if not _key_verifies(parsed.key, parsed.signature, signed_data(namespace, parsed.hash_algorithm, hashed)):
        raise SshSigError("the signature does not verify: the content or the signature was changed")
    return parsed


# ---- allowed_signers ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AllowedSigner:
    line: int
    principals: str  # a pattern list: alice@example.com,*@example.org,!mallory@example.org
    key: PublicKey | None  # None: a key type this verifier does not read (the line never admits a signature)
    cert_authority: bool = False
    namespaces: str | None = None
    valid_after: float | None = None
    valid_before: float | None = None


def match_pattern(text: str, pattern: str) -> bool:
    """OpenSSH's match_pattern: `*` any run, `?` one character, nothing else is special."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, text, re.DOTALL) is not None


def match_pattern_list(text: str, patterns: str) -> bool:
    """OpenSSH's match_pattern_list(...) == 1: some pattern matches and no negated (`!`) one does."""
    positive = False
    for pattern in patterns.split(","):
        if pattern.startswith("!"):
            if match_pattern(text, pattern[1:]):
                return False
        elif match_pattern(text, pattern):
            positive = True
    return positive


def _token(text: str, pos: int) -> tuple[str, int]:
    """One whitespace-delimited word from `pos`, a double-quoted one whole (OpenSSH's strdelimw)."""
    if text.startswith('"', pos):
        end = text.find('"', pos + 1)
        if end < 0:
            raise SshSigError("an unterminated quote")
        return text[pos + 1:end], end + 1
    match = re.compile(r"[^ \t]*").match(text, pos)
    return match.group(), match.end()


def _options(text: str, pos: int) -> tuple[dict, int]:
    """`cert-authority,namespaces="a,b",valid-after="20260101"`: the option words up to the key."""
    options: dict = {}
    while True:
        match = re.compile(r'([A-Za-z-]+)(="([^"]*)")?').match(text, pos)
        if not match:
            raise SshSigError("malformed options")
        name, value = match.group(1).lower(), match.group(3)
        if name == "cert-authority" and value is None:
            options["cert-authority"] = True
        elif name in ("namespaces", "valid-after", "valid-before") and value is not None:
            if name in options:
                raise SshSigError(f"{name} given twice")
            options[name] = value
        else:
            raise SshSigError(f"unknown option {match.group(0)[:40]!r}")
        pos = match.end()
        if pos >= len(text) or text[pos] in " \t":
            return options, pos
        if text[pos] != ",":
            raise SshSigError("malformed options")
        pos += 1


_DIGITS = re.compile(r"[0-9]{8}([0-9]{4}([0-9]{2})?)?")


def _timestamp(value: str) -> float:
    """ssh-keygen's parse_absolute_time: YYYYMMDD[HHMM[SS]] in local standard time (OpenSSH hands mktime a
    tm_isdst of 0, so a July noon in Paris is 11:00Z), or UTC with a trailing Z or UTC in any case; each field in
    strptime's range (month 1-12, day 1-31, hour 0-23, minute 0-59, second 0-61), then normalised as timegm and
    mktime do (February 30 is March 2); a time at or before 1970-01-01T00:00:00Z refuses the line."""
    utc, digits = False, value
    if len(value) > 1 and value[-1] in "Zz":
        utc, digits = True, value[:-1]
    elif len(value) > 3 and value[-3:].upper() == "UTC":
        utc, digits = True, value[:-3]
    if not _DIGITS.fullmatch(digits):
        raise SshSigError(f"a time {value[:30]!r} not written YYYYMMDD[HHMM[SS]][Z]")
    year, month, day, hour, minute, second = (int(digits[i:i + 2 + 2 * (i == 0)] or 0) for i in (0, 4, 6, 8, 10, 12))
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour <= 23 and minute <= 59 and second <= 61):
        raise SshSigError(f"a time {value[:30]!r} that does not exist")
    try:
        fields = (year, month, day, hour, minute, second, 0, 0, 0)
        stamp = float(calendar.timegm(fields) if utc else time.mktime(fields))
    except (ValueError, OverflowError):  # year 0, or past what the platform's time_t holds
        raise SshSigError(f"a time {value[:30]!r} that does not exist") from None
    if stamp <= 0:
        raise SshSigError(f"a time {value[:30]!r} at or before 1970-01-01T00:00:00Z")
    return stamp


_KEY_WORD = re.compile(r"(ssh-|ecdsa-|sk-)[A-Za-z0-9@._-]+[ \t]")


def _allowed_line(number: int, line: str) -> AllowedSigner:
    principals, pos = _token(line, 0)
    rest = line[pos:].lstrip(" \t")
    options: dict = {}
    if not _KEY_WORD.match(rest):  # OpenSSH reads a key first, and options when that fails
        options, end = _options(rest, 0)
        rest = rest[end:].lstrip(" \t")
    words = rest.split()
    if len(words) < 2:
        raise SshSigError("no key")
    try:
        key = parse_public_key_text(" ".join(words[:2]))
    except SshSigError:
        if words[0] in KEY_TYPES:
            raise
        key = None  # a certificate, a security key, DSA: never matches here
    return AllowedSigner(number, principals, key, bool(options.get("cert-authority")), options.get("namespaces"),
                         _timestamp(options["valid-after"]) if "valid-after" in options else None,
                         _timestamp(options["valid-before"]) if "valid-before" in options else None)


def parse_allowed_signers(text: str) -> tuple[list[AllowedSigner], list[tuple[int, str]]]:
    """The entries of an allowed_signers file and the lines that are not entries, (line, why): OpenSSH skips
    those with an error message, and so does the audit (it shows them)."""
    entries, problems = [], []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip(" \t\r")
        if not line or line.startswith("#"):
            continue
        try:
            entries.append(_allowed_line(number, line))
        except SshSigError as exc:
            problems.append((number, str(exc)))
    return entries, problems


def allowed_principals(entries: list[AllowedSigner], key: PublicKey, namespace: str, now: float,
                       principal: str | None = None) -> list[str]:
    """The principal fields of the entries that admit `key` for `namespace` at `now` (and `principal`, when one
    is required, as `ssh-keygen -Y verify -I` requires it)."""
    found = []
    for entry in entries:
        if entry.key is None or entry.cert_authority or entry.key.blob != key.blob:
            continue
        if principal is not None and not match_pattern_list(principal, entry.principals):
            continue
        if entry.namespaces is not None and not match_pattern_list(namespace, entry.namespaces):
            continue
        if (entry.valid_after is not None and now < entry.valid_after) or \
                (entry.valid_before is not None and now > entry.valid_before):
            continue
        found.append(entry.principals)
    return found
