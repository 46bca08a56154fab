"""The arithmetic behind OpenSSH signature verification, in pure Python: Ed25519, ECDSA over NIST P-256/384/521,
RSA PKCS#1 v1.5 with SHA-256/512. Verification only: every input is public, so nothing here needs to be
constant-time, and nothing here ever holds a private key.

Each check decides exactly as OpenSSH 9 does (the audit is tested against `ssh-keygen -Y verify`):
- Ed25519 is OpenSSH's ref10 code: S is refused only when its top three bits are set (then reduced mod L), the
  public key's y is read mod p, and R must equal the encoding of [S]B - [h]A byte for byte (cofactorless).
- ECDSA: the public point is validated as sshkey_ec_validate_public does (on the curve, of order n, both
  coordinates longer than half the order's bits and below n - 1); r and s lie in [1, n - 1].
- RSA: 1024 to 16384 bits, e below n (at most 64 bits past 3072-bit moduli), the signature below n, and the
  PKCS#1 v1.5 block compared whole.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

# ---- Ed25519 (RFC 8032) --------------------------------------------------------------------------------------
_P = 2 ** 255 - 19
_L = 2 ** 252 + 27742317777372353535851937790883648493
_D = -121665 * pow(121666, -1, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)


def _ed_add(a, b):
    x1, y1, z1, t1 = a
    x2, y2, z2, t2 = b
    k = (y1 - x1) * (y2 - x2) % _P
    l_ = (y1 + x1) * (y2 + x2) % _P
    c = 2 * _D * t1 * t2 % _P
    d = 2 * z1 * z2 % _P
    e, f, g, h = l_ - k, d - c, d + c, l_ + k
    return e * f % _P, g * h % _P, f * g % _P, e * h % _P


def _ed_mul(n: int, point):
    result = (0, 1, 1, 0)
    while n:
        if n & 1:
            result = _ed_add(result, point)
        point = _ed_add(point, point)
        n >>= 1
    return result


def _ed_encode(point) -> bytes:
    x, y, z, _ = point
    inverse = pow(z, -1, _P)
    x, y = x * inverse % _P, y * inverse % _P
    return (y | ((x & 1) << 255)).to_bytes(32, "little")


def _ed_decode(data: bytes):
    """The point as ref10's ge25519_unpackneg_vartime reads it (y mod p; x = 0 with the sign bit is accepted);
    None when y has no x on the curve."""
    raw = int.from_bytes(data, "little")
    sign, y = raw >> 255, (raw & ((1 << 255) - 1)) % _P
    x2 = (y * y - 1) * pow(_D * y * y + 1, -1, _P) % _P
    x = pow(x2, (_P + 3) // 8, _P)
    if (x * x - x2) % _P:
        x = x * _SQRT_M1 % _P
    if (x * x - x2) % _P:
        return None
    if x & 1 != sign:
        x = (_P - x) % _P
    return x, y, 1, x * y % _P


_ED_BASE = _ed_decode((4 * pow(5, -1, _P) % _P).to_bytes(32, "little"))


def ed25519_verify(public: bytes, signature: bytes, message: bytes) -> bool:
    if len(public) != 32 or len(signature) != 64 or signature[63] & 0xE0:
        return False
    point = _ed_decode(public)
    if point is None:
        return False
    h = int.from_bytes(hashlib.sha512(signature[:32] + public + message).digest(), "little") % _L
    s = int.from_bytes(signature[32:], "little")
    x, y, z, t = _ed_mul(h, point)
    check = _ed_add(_ed_mul(s, _ED_BASE), ((_P - x) % _P, y, z, (_P - t) % _P))
    return _ed_encode(check) == signature[:32]


# ---- ECDSA over the NIST curves (FIPS 186-4, SEC 1) ---------------------------------------------------------
@dataclass(frozen=True)
class Curve:
    name: str  # OpenSSH's: nistp256
    p: int
    b: int
    gx: int
    gy: int
    n: int
    hash: str  # the digest OpenSSH signs with on this curve

    @property
    def field_bytes(self) -> int:
        return (self.p.bit_length() + 7) // 8


CURVES = {c.name: c for c in (
    Curve("nistp256", 2 ** 256 - 2 ** 224 + 2 ** 192 + 2 ** 96 - 1,
          0x5AC635D8AA3A93E7B3EBBD55769886BC651D06B0CC53B0F63BCE3C3E27D2604B,
          0x6B17D1F2E12C4247F8BCE6E563A440F277037D812DEB33A0F4A13945D898C296,
          0x4FE342E2FE1A7F9B8EE7EB4A7C0F9E162BCE33576B315ECECBB6406837BF51F5,
          0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551, "sha256"),
    Curve("nistp384", 2 ** 384 - 2 ** 128 - 2 ** 96 + 2 ** 32 - 1,
          0xB3312FA7E23EE7E4988E056BE3F82D19181D9C6EFE8141120314088F5013875AC656398D8A2ED19D2A85C8EDD3EC2AEF,
          0xAA87CA22BE8B05378EB1C71EF320AD746E1D3B628BA79B9859F741E082542A385502F25DBF55296C3A545E3872760AB7,
          0x3617DE4A96262C6F5D9E98BF9292DC29F8F41DBD289A147CE9DA3113B5F0B8C00A60B1CE1D7E819D7A431D7C90EA0E5F,
          0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFC7634D81F4372DDF581A0DB248B0A77AECEC196ACCC52973,
          "sha384"),
    Curve("nistp521", 2 ** 521 - 1,
          int("0051953EB9618E1C9A1F929A21A0B68540EEA2DA725B99B315F3B8B489918EF109E156193951EC7E937B1652C0BD3BB1BF073573DF8"
              "83D2C34F1EF451FD46B503F00", 16),
          int("00C6858E06B70404E9CD9E3ECB662395B4429C648139053FB521F828AF606B4D3DBAA14B5E77EFE75928FE1DC127A2FFA8DE3348B3C"
              "1856A429BF97E7E31C2E5BD66", 16),
          int("011839296A789A3BC0045C8A5FB42C7D1BD998F54449579B446817AFBD17273E662C97EE72995EF42640C550B9013FAD0761353C708"
              "6A272C24088BE94769FD16650", 16),
          int("01" + "FF" * 32 + "FA51868783BF2F966B7FCC0148F709A5D03BB5C9B8899C47AEBB6FB71E91386409", 16), "sha512"),
)}


def _ec_add(curve: Curve, a, b):
    """Affine points, None for the point at infinity (a = -3 on all three curves)."""
    if a is None:
        return b
    if b is None:
        return a
    p = curve.p
    if a[0] == b[0]:
        if (a[1] + b[1]) % p == 0:
            return None
        slope = (3 * a[0] * a[0] - 3) * pow(2 * a[1], -1, p) % p
    else:
        slope = (b[1] - a[1]) * pow(b[0] - a[0], -1, p) % p
    x = (slope * slope - a[0] - b[0]) % p
    return x, (slope * (a[0] - x) - a[1]) % p


def _ec_mul(curve: Curve, n: int, point):
    result = None
    while n:
        if n & 1:
            result = _ec_add(curve, result, point)
        point = _ec_add(curve, point, point)
        n >>= 1
    return result


def ec_point(curve: Curve, data: bytes):
    """The public point of an OpenSSH ECDSA key (uncompressed form only), validated as OpenSSH validates it;
    None when OpenSSH would refuse the key."""
    size = curve.field_bytes
    if len(data) != 1 + 2 * size or data[0] != 4:
        return None
    x, y = int.from_bytes(data[1:1 + size], "big"), int.from_bytes(data[1 + size:], "big")
    p, n = curve.p, curve.n
    if x >= p or y >= p or (y * y - (x * x * x - 3 * x + curve.b)) % p:
        return None
    half = n.bit_length() // 2
    if x.bit_length() <= half or y.bit_length() <= half or x >= n - 1 or y >= n - 1:
        return None
    if _ec_mul(curve, n, (x, y)) is not None:
        return None
    return x, y


def ecdsa_verify(curve: Curve, point, r: int, s: int, message: bytes) -> bool:
    n = curve.n
    if not (0 < r < n and 0 < s < n):
        return False
    digest = hashlib.new(curve.hash, message).digest()
    e = int.from_bytes(digest, "big")
    excess = len(digest) * 8 - n.bit_length()
    if excess > 0:
        e >>= excess
    w = pow(s, -1, n)
    total = _ec_add(curve, _ec_mul(curve, e * w % n, (curve.gx, curve.gy)), _ec_mul(curve, r * w % n, point))
    return total is not None and total[0] % n == r


# ---- RSA PKCS#1 v1.5 (RFC 8017 §8.2.2) ------------------------------------------------------------------------
_DIGEST_INFO = {"sha256": bytes.fromhex("3031300d060960864801650304020105000420"),
                "sha512": bytes.fromhex("3051300d060960864801650304020305000440")}
RSA_MIN_BITS, RSA_MAX_BITS = 1024, 16384  # OpenSSH's SSH_RSA_MINIMUM_MODULUS_SIZE, OpenSSL's maximum


def rsa_key_problem(e: int, n: int) -> str | None:
    bits = n.bit_length()
    if bits < RSA_MIN_BITS or bits > RSA_MAX_BITS:
        return f"an RSA key of {bits} bits (OpenSSH accepts {RSA_MIN_BITS} to {RSA_MAX_BITS})"
    if e >= n or e < 1 or (bits > 3072 and e.bit_length() > 64):
        return "an RSA key with an exponent OpenSSH refuses"
    return None


def rsa_verify(e: int, n: int, hash_name: str, signature: bytes, message: bytes) -> bool:
    size = (n.bit_length() + 7) // 8
    if rsa_key_problem(e, n) or len(signature) > size or hash_name not in _DIGEST_INFO:
        return False
    value = int.from_bytes(signature, "big")  # a shorter signature is read left-padded, as OpenSSH pads it
    if value >= n:
        return False
    info = _DIGEST_INFO[hash_name] + hashlib.new(hash_name, message).digest()
    expected = b"\x00\x01" + b"\xff" * (size - len(info) - 3) + b"\x00" + info
    return pow(value, e, n).to_bytes(size, "big") == expected
