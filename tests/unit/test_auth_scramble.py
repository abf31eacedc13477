"""proxy.protocol.scramble, the proxy's own copy of the password scrambles (it used PyMySQL's
private ``pymysql._auth``): golden bytes for fixed nonces, the server's own checks, and the
RSA path decrypted with the private key the way the server does."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from proxy.protocol import scramble
from proxy.protocol.auth import SHA256, ClientAuth
from proxy.protocol.packets import AUTH_MORE_DATA, ProtocolError

REPO = Path(__file__).resolve().parents[2]
NONCE = bytes(range(1, 21))  # 01 02 .. 14

# (password, mysql_native_password answer, caching_sha2_password fast-path answer) to NONCE;
# computed once with PyMySQL 1.2.4's pymysql._auth (which logs in to MySQL, MariaDB and TiDB).
GOLDEN = [
    (b"apppw", "d852a1e4b2d554befa544f8394f7207021d09040", "04c582badddcb5b1424a585cfc2b0c3cdeec6d229562f8b197ab80ece68ad552"),
    (b"secret", "b32bb3a583e1340c0a1108d58b1be49781ad8c2f", "746ebe205d56a0707acb3e796e834e0dd7b1d61743b26bd5202c7a623230c7c9"),
    ("pässwörd".encode(), "9891a8536587af22d12e126cf5f7a8ea86d63b0e", "8526563d365f5cb2cf44b162e5251a5cc348e1a1afeec271669611d0fdac23f7"),
]


@pytest.mark.parametrize(("password", "native", "sha2"), GOLDEN)
def test_golden_scrambles(password, native, sha2):
    assert scramble.native(password, NONCE).hex() == native
    assert scramble.caching_sha2(password, NONCE).hex() == sha2


def test_a_greetings_trailing_nul_is_not_part_of_the_native_nonce():
    assert scramble.native(b"apppw", NONCE + b"\0").hex() == GOLDEN[0][1]


def test_an_empty_password_answers_nothing():
    assert scramble.native(b"", NONCE) == b"" and scramble.caching_sha2(b"", NONCE) == b""


def test_the_native_answer_passes_the_servers_check_against_the_stored_hash():
    """What mysql.user stores for 'apppw' (PASSWORD('apppw') on MariaDB 10.11) and the server's
    check: SHA1(answer XOR SHA1(nonce + stored)) == stored."""
    stored = bytes.fromhex("DB14CBAE92D7CB2F84BD3AA7222415B564A4054A")
    answer = scramble.native(b"apppw", NONCE)
    stage1 = bytes(a ^ b for a, b in zip(answer, hashlib.sha1(NONCE + stored).digest()))
    assert hashlib.sha1(stage1).digest() == stored


def test_the_sha2_answer_passes_the_servers_fast_path_check():
    """The server caches SHA256(SHA256(pw)) and checks SHA256(answer XOR SHA256(cached + nonce)) == cached."""
    cached = hashlib.sha256(hashlib.sha256(b"secret").digest()).digest()
    answer = scramble.caching_sha2(b"secret", NONCE)
    p1 = bytes(a ^ b for a, b in zip(answer, hashlib.sha256(cached + NONCE).digest()))
    assert hashlib.sha256(p1).digest() == cached


def _rsa_key():
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return key, pem


def test_rsa_encrypt_decrypts_to_the_nul_terminated_password_xor_the_nonce():
    key, pem = _rsa_key()
    encrypted = scramble.rsa_encrypt(b"apppw", NONCE + b"\0", pem)
    assert len(encrypted) == 256
    oaep = padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA1()), algorithm=hashes.SHA1(), label=None)
    assert key.decrypt(encrypted, oaep) == bytes.fromhex("607273747206")  # b"apppw\0" XOR 01 02 03 04 05 06


def test_rsa_encrypt_cycles_the_nonce_over_a_long_password():
    key, pem = _rsa_key()
    password = b"x" * 45
    oaep = padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA1()), algorithm=hashes.SHA1(), label=None)
    plain = key.decrypt(scramble.rsa_encrypt(password, NONCE, pem), oaep)
    assert plain == bytes(b ^ NONCE[i % 20] for i, b in enumerate(password + b"\0"))


def test_a_key_that_is_not_rsa_is_a_protocol_error_in_the_login():
    ec_pem = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(TypeError):
        scramble.rsa_encrypt(b"pw", NONCE, ec_pem)
    auth = ClientAuth("app", "pw", NONCE, SHA256)
    assert auth.first_response() == b"\x01"  # asks for the key
    with pytest.raises(ProtocolError, match="unusable RSA public key"):
        auth.on_packet(bytes([AUTH_MORE_DATA]) + ec_pem)
    auth = ClientAuth("app", "pw", NONCE, SHA256)
    auth.first_response()
    with pytest.raises(ProtocolError, match="unusable RSA public key"):
        auth.on_packet(bytes([AUTH_MORE_DATA]) + b"not a PEM")


def test_the_proxy_does_not_import_pymysql():
    """PyMySQL is a test client now, not a dependency of the proxy: nothing it runs loads it."""
    probe = "import sys, proxy.cli, proxy.frontend, proxy.backend, proxy.preflight; print('pymysql' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"
