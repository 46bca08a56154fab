"""The pure verifier (format/sshsig.py) against `ssh-keygen -Y verify` (issue 35 item 8): every case below is run
through both, and both must accept or both refuse. RSA signatures of every kind the SSHSIG format can carry
(rsa-sha2-512/256 and ssh-rsa, i.e. SHA-1, crafted here with `cryptography`, since ssh-keygen always signs with
SHA-512), malformed keys, `valid-after`/`valid-before` at their edges and in every form (`-O verify-time` pins
ssh-keygen's clock; the verifier is handed the same instant), and principal patterns with `-I` / `--signer`."""
from __future__ import annotations

import base64
import calendar
import hashlib
import random
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, padding, rsa

from itera_verify.format import sshsig
from itera_verify.format.statement import NAMESPACE
from tests.test_signatures import keygen

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen")

MESSAGE = b"the bytes of a statement\n"
T = calendar.timegm((2026, 1, 1, 0, 0, 0))  # 2026-01-01T00:00:00Z


def _string(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def _mpint(value: int, pad: int = 0) -> bytes:
    raw = value.to_bytes((value.bit_length() + 8) // 8, "big") if value else b""
    return _string(bytes(pad) + raw)


def _rsa_blob(e: int, n: int, pad: int = 0) -> bytes:
    return _string(b"ssh-rsa") + _mpint(e) + _mpint(n, pad)


def _sign_rsa(d: int, n: int, hash_name: str, data: bytes) -> bytes:
    """PKCS#1 v1.5 by hand (for keys `cryptography` will not make)."""
    infos = {"sha1": "3021300906052b0e03021a05000414", "sha256": "3031300d060960864801650304020105000420",
             "sha512": "3051300d060960864801650304020305000440"}
    info = bytes.fromhex(infos[hash_name]) + hashlib.new(hash_name, data).digest()
    size = (n.bit_length() + 7) // 8
    block = b"\x00\x01" + b"\xff" * (size - len(info) - 3) + b"\x00" + info
    return pow(int.from_bytes(block, "big"), d, n).to_bytes(size, "big")


def _prime(bits: int, rng: random.Random) -> int:
    while True:
        candidate = rng.getrandbits(bits) | (1 << (bits - 1)) | 1
        if all(pow(a, candidate - 1, candidate) == 1 for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)):
            return candidate


class Case:
    """One signature over MESSAGE and the allowed_signers text it is checked with."""

    def __init__(self, key_blob: bytes, signature: bytes, hash_name: str = "sha512", allowed: bytes | None = None,
                 key_type: str = "ssh-rsa"):
        self.armored = sshsig.armor(key_blob, NAMESPACE, hash_name, signature)
        line_blob = key_blob if allowed is None else allowed
        self.allowed = f"any {key_type} {base64.b64encode(line_blob).decode()}\n"


def openssh(folder: Path, allowed: str, armored: bytes, identity: str = "any", when: int | None = None,
            message: bytes = MESSAGE) -> bool:
    (folder / "allowed").write_text(allowed)
    (folder / "message.sig").write_bytes(armored)
    clock = ["-O", "verify-time=" + time.strftime("%Y%m%d%H%M%SZ", time.gmtime(when))] if when is not None else []
    done = subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(folder / "allowed"), "-I", identity, "-n",
                           NAMESPACE, "-s", str(folder / "message.sig"), *clock], input=message,
                          capture_output=True)
    return done.returncode == 0


def ours(allowed: str, armored: bytes, identity: str = "any", when: float | None = None,
         message: bytes = MESSAGE) -> bool:
    entries, _ = sshsig.parse_allowed_signers(allowed)
    try:
        key = sshsig.verify(armored, NAMESPACE, message).key
    except sshsig.SshSigError:
        return False
    return bool(sshsig.allowed_principals(entries, key, NAMESPACE, time.time() if when is None else when, identity))


def agree(folder: Path, allowed: str, armored: bytes, identity: str = "any", when: int | None = None) -> bool:
    expected = openssh(folder, allowed, armored, identity, when)
    assert ours(allowed, armored, identity, when) == expected, (allowed, identity, when, expected)
    return expected


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _numbers(key: rsa.RSAPrivateKey) -> tuple[int, int, int]:
    numbers = key.private_numbers()
    return numbers.public_numbers.e, numbers.public_numbers.n, numbers.d


# ---- RSA: which signature algorithms -------------------------------------------------------------------------
@pytest.mark.parametrize("label,hash_name,accepted", [
    ("rsa-sha2-512", "sha512", True), ("rsa-sha2-256", "sha256", True),
    ("ssh-rsa", "sha1", False),  # SHA-1: refused by ssh-keygen, and so by the audit
    ("rsa-sha2-512", "sha256", False), ("rsa-sha2-256", "sha512", False), ("ssh-rsa", "sha512", False)])
def test_rsa_signature_algorithms_agree_with_ssh_keygen(rsa_key, tmp_path, label, hash_name, accepted):
    e, n, _ = _numbers(rsa_key)
    data = sshsig.signed_data(NAMESPACE, "sha512", hashlib.sha512(MESSAGE).digest())
    raw = rsa_key.sign(data, padding.PKCS1v15(), {"sha1": hashes.SHA1(), "sha256": hashes.SHA256(),
                                                  "sha512": hashes.SHA512()}[hash_name])
    case = Case(_rsa_blob(e, n), _string(label.encode()) + _string(raw))
    assert agree(tmp_path, case.allowed, case.armored) is accepted


@pytest.mark.parametrize("hash_name", ["sha1", "sha384", "md5"])
def test_an_sshsig_hash_other_than_sha256_or_sha512_is_refused_by_both(tmp_path, hash_name):
    key = ed25519.Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    blob = _string(b"ssh-ed25519") + _string(public)
    raw = key.sign(sshsig.signed_data(NAMESPACE, hash_name, hashlib.new(hash_name, MESSAGE).digest()))
    case = Case(blob, _string(b"ssh-ed25519") + _string(raw), hash_name, key_type="ssh-ed25519")
    assert agree(tmp_path, case.allowed, case.armored) is False


# ---- malformed and unusual keys ------------------------------------------------------------------------------
def _rsa_case(e: int, n: int, d: int, **blob) -> Case:
    data = sshsig.signed_data(NAMESPACE, "sha512", hashlib.sha512(MESSAGE).digest())
    return Case(_rsa_blob(e, n, **blob), _string(b"rsa-sha2-512") + _string(_sign_rsa(d, n, "sha512", data)))


@pytest.mark.parametrize("bits,accepted", [(768, False), (1016, False), (1024, True)])
def test_rsa_moduli_at_the_1024_bit_floor_agree_with_ssh_keygen(tmp_path, bits, accepted):
    rng = random.Random(bits)
    while True:
        p, q = _prime(bits // 2, rng), _prime(bits - bits // 2, rng)
        n, phi = p * q, (p - 1) * (q - 1)
        if n.bit_length() == bits and phi % 65537:
            break
    case = _rsa_case(65537, n, pow(65537, -1, phi))
    assert agree(tmp_path, case.allowed, case.armored) is accepted


def test_rsa_keys_with_exponent_1_or_3_agree_with_ssh_keygen(rsa_key, tmp_path):
    e, n, d = _numbers(rsa_key)
    # Exponent 1: the "signature" is the padded block itself, and OpenSSH (OpenSSL) accepts such a key when the
    # reviewer's own allowed_signers holds it. The verifier does as ssh-keygen does: a reviewer's file is trusted.
    assert agree(tmp_path, _rsa_case(1, n, 1).allowed, _rsa_case(1, n, 1).armored)
    three = rsa.generate_private_key(public_exponent=3, key_size=2048)
    case = _rsa_case(*_numbers(three))
    assert agree(tmp_path, case.allowed, case.armored)


def test_an_rsa_key_written_with_a_leading_zero_byte_agrees_with_ssh_keygen(rsa_key, tmp_path):
    """The same key, its modulus encoded with one byte too many in the signature or in allowed_signers."""
    e, n, d = _numbers(rsa_key)
    padded = _rsa_case(e, n, d, pad=1)
    plain = _rsa_case(e, n, d)
    agree(tmp_path, plain.allowed, padded.armored)
    agree(tmp_path, padded.allowed, plain.armored)


@pytest.mark.parametrize("damage", ["ed25519 key of 31 bytes", "ed25519 key with a trailing byte",
                                    "ecdsa point off the curve", "ecdsa point compressed", "key type mislabelled"])
def test_malformed_keys_are_refused_by_both(tmp_path, damage):
    kind = "ed25519" if damage.startswith(("ed25519", "key type")) else "ecdsa256"
    key = keygen(tmp_path, "k", kind)
    armored = subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(key), "-n", NAMESPACE],
                             input=MESSAGE, check=True, capture_output=True).stdout
    parsed = sshsig.parse_signature(armored)
    key_type, blob = parsed.key.algorithm, bytearray(parsed.key.blob)
    if damage == "ed25519 key of 31 bytes":
        blob = bytearray(_string(b"ssh-ed25519") + _string(bytes(blob[-31:])))
    elif damage == "ed25519 key with a trailing byte":
        blob += b"\0"
    elif damage == "ecdsa point off the curve":
        blob[-1] ^= 1
    elif damage == "ecdsa point compressed":
        point = blob[-65:]
        blob = bytearray(blob[:-69] + _string(bytes([2 + (point[-1] & 1)]) + bytes(point[1:33])))
    else:
        blob[4:15] = b"ssh-ed25518"
    case = Case(bytes(blob), parsed.signature, parsed.hash_algorithm, key_type=key_type)
    assert agree(tmp_path, case.allowed, case.armored) is False


# ---- allowed_signers: validity times and principals ----------------------------------------------------------
@pytest.fixture(scope="module")
def signed_message(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("valid")
    key = keygen(folder, "alice")
    armored = subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-f", str(key), "-n", NAMESPACE],
                             input=MESSAGE, check=True, capture_output=True).stdout
    return {"armored": armored, "key": key.with_suffix(".pub").read_text().strip()}


@pytest.mark.parametrize("option", ["valid-after", "valid-before"])
@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_validity_at_its_edge_second_agrees_with_ssh_keygen(signed_message, tmp_path, option, offset):
    allowed = f'alice@example.com {option}="20260101000000Z" {signed_message["key"]}\n'
    accepted = agree(tmp_path, allowed, signed_message["armored"], "alice@example.com", T + offset)
    assert accepted is ((offset >= 0) if option == "valid-after" else (offset <= 0))  # both edges inclusive


TIMES = ["20260101", "202601011230", "20260101123045", "20260101Z", "20260101z", "20260101UTC", "20260101utc",
         "2026010112Z", "20261301", "20260100", "20260230", "20260431", "20260101240000", "20260101006000",
         "20260101000060", "20260101000061", "20260101000062", "19690101Z", "19700101Z", "19700101000001Z",
         "00010101Z", "99991231Z", "2026-1-1", " 2026010", "+2026010", "２０２６０１０１", "20260101GMT",
         "20260101UTCZ", "Z", ""]


@pytest.mark.slow
def test_validity_times_in_every_form_agree_with_ssh_keygen(signed_message, tmp_path):
    """Whether each form is read at all, and which way: every stamp as each option, long before and long after."""
    before, after = calendar.timegm((1980, 1, 1, 0, 0, 0)), calendar.timegm((9999, 12, 31, 0, 0, 0))
    for stamp in TIMES:
        for option in ("valid-after", "valid-before"):
            allowed = f'alice@example.com {option}="{stamp}" {signed_message["key"]}\n'
            for when in (before, after):
                agree(tmp_path, allowed, signed_message["armored"], "alice@example.com", when)
    unquoted = f"alice@example.com valid-after=20200101 {signed_message['key']}\n"
    assert agree(tmp_path, unquoted, signed_message["armored"], "alice@example.com", T) is False


EDGES = [  # (stamp, the instant it names, in Europe/Paris)
    ("20260701120000", calendar.timegm((2026, 7, 1, 11, 0, 0))),  # standard time, as ssh-keygen reads it (tm_isdst 0)
    ("20260101120000", calendar.timegm((2026, 1, 1, 11, 0, 0))),
    ("202601011200", calendar.timegm((2026, 1, 1, 11, 0, 0))),
    ("20260101", calendar.timegm((2025, 12, 31, 23, 0, 0))),
    ("20260101UTC", T), ("20260101z", T),
    ("20260230Z", calendar.timegm((2026, 3, 2, 0, 0, 0))),  # normalised as timegm does
    ("20260101000060Z", T + 60), ("20260101000061Z", T + 61)]


@pytest.mark.parametrize("stamp,instant", EDGES)
def test_validity_edges_in_local_and_utc_forms_agree_with_ssh_keygen(signed_message, tmp_path, monkeypatch, stamp,
                                                                      instant):
    monkeypatch.setenv("TZ", "Europe/Paris")
    time.tzset()
    try:
        allowed = f'alice@example.com valid-after="{stamp}" {signed_message["key"]}\n'
        assert agree(tmp_path, allowed, signed_message["armored"], "alice@example.com", instant - 1) is False
        assert agree(tmp_path, allowed, signed_message["armored"], "alice@example.com", instant) is True
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize("principals", ["*@example.com,!mallory@example.com", "alice@example.com,bob?@example.org",
                                        "*", "!*", "*,!*", "ALICE@EXAMPLE.COM", '"alice@example.com"',
                                        "a*e@example.com", "alice@example.com,", ",alice@example.com"])
def test_principal_patterns_with_signer_agree_with_ssh_keygen(signed_message, tmp_path, principals):
    allowed = f"{principals} {signed_message['key']}\n"
    for identity in ("alice@example.com", "mallory@example.com", "bob1@example.org", "bob12@example.org", "*",
                     "ALICE@example.com", "ae@example.com", "x"):
        agree(tmp_path, allowed, signed_message["armored"], identity)
