"""The password scrambles of MySQL's authentication plugins, for both sides of a login.

- ``native``: mysql_native_password, ``SHA1(password) XOR SHA1(nonce + SHA1(SHA1(password)))``;
- ``caching_sha2``: caching_sha2_password's fast path, ``SHA256(password) XOR
  SHA256(SHA256(SHA256(password)) + nonce)``;
- ``rsa_encrypt``: sha256_password's and caching_sha2_password's full authentication without
  TLS, ``RSA-OAEP(SHA-1)(password + NUL XOR nonce)`` with the server's public key.

Adapted from PyMySQL's ``pymysql/_auth.py`` (a private module: the proxy owned a dependency on
it with no stable interface). PyMySQL's licence, under which these lines are used:

    Copyright (c) 2010, 2013 PyMySQL contributors

    Permission is hereby granted, free of charge, to any person obtaining a copy of this
    software and associated documentation files (the "Software"), to deal in the Software
    without restriction, including without limitation the rights to use, copy, modify, merge,
    publish, distribute, sublicense, and/or sell copies of the Software, and to permit persons
    to whom the Software is furnished to do so, subject to the following conditions:

    The above copyright notice and this permission notice shall be included in all copies or
    substantial portions of the Software.

    THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED,
    INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR
    PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE
    FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR
    OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER
    DEALINGS IN THE SOFTWARE.
"""

from __future__ import annotations

import hashlib

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

__all__ = ["SCRAMBLE_LENGTH", "native", "caching_sha2", "rsa_encrypt"]

SCRAMBLE_LENGTH = 20  # the nonce's length; a greeting's auth data may carry a trailing NUL


def _xor(data: bytes, key: bytes) -> bytes:
    """``data`` XOR ``key`` repeated (``key`` at least as long, or cycled)."""
    return bytes(b ^ key[i % len(key)] for i, b in enumerate(data))


def native(password: bytes, nonce: bytes) -> bytes:
    """mysql_native_password's answer to ``nonce`` (20 bytes; b"" for an empty password)."""
    if not password:
        return b""
    stage1 = hashlib.sha1(password).digest()
    stage2 = hashlib.sha1(stage1).digest()
    return _xor(hashlib.sha1(nonce[:SCRAMBLE_LENGTH] + stage2).digest(), stage1)


def caching_sha2(password: bytes, nonce: bytes) -> bytes:
    """caching_sha2_password's fast-path answer to ``nonce`` (32 bytes; b"" for an empty password)."""
    if not password:
        return b""
    p1 = hashlib.sha256(password).digest()
    p2 = hashlib.sha256(p1).digest()
    return _xor(p1, hashlib.sha256(p2 + nonce).digest())


def rsa_encrypt(password: bytes, nonce: bytes, public_key_pem: bytes) -> bytes:
    """The password (NUL-terminated, XOR the nonce) encrypted with the server's RSA public key
    (PEM), OAEP with SHA-1, as the server decrypts it. Raises ValueError / TypeError /
    UnsupportedAlgorithm for a key that is not a usable RSA public key."""
    key = serialization.load_pem_public_key(public_key_pem)
    if not isinstance(key, rsa.RSAPublicKey):
        raise TypeError(f"not an RSA public key but {type(key).__name__}")
    message = _xor(password + b"\0", nonce[:SCRAMBLE_LENGTH])
    return key.encrypt(message, padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA1()), algorithm=hashes.SHA1(), label=None))
