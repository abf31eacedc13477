"""A small seeded mutator: the short CI mode, and the fallback engine without atheris.

Not coverage-guided; it knows what the targets' inputs look like (little-endian 3-byte
lengths, length-encoded integers, SQL punctuation) and mutates the seeds with that in mind.
"""

from __future__ import annotations

import random

__all__ = ["Mutator"]

_BYTES = (0x00, 0x01, 0x03, 0x0A, 0x11, 0x16, 0x17, 0x7F, 0x80, 0xFB, 0xFC, 0xFD, 0xFE, 0xFF)
_LENGTHS = (0, 1, 2, 4, 5, 7, 8, 12, 13, 0xFFFFFF, 0xFFFFFE, 0x800000, 0x100000, 0x10000)
_TOKENS = [
    b"'", b'"', b"`", b"\\", b"''", b"\\'", b"/*", b"*/", b"/*!", b"/*!50001 ", b"/*!99999 ", b"/*M!", b"/*M!100100 ",
    b"/*T![x] ", b"/*+ ", b"-- ", b"--", b"#", b"\n", b";", b"(", b")", b",", b"@", b"@@", b"?", b":=", b".", b"0x",
    b"X'", b"b'", b"N'", b"_binary", b" SELECT ", b" INSERT INTO t VALUES ", b" ON DUPLICATE KEY UPDATE ", b" SET ",
    b" BEGIN", b" COMMIT", b" ROLLBACK", b" XA ", b" CALL ", b" FOR UPDATE", b" INTO @v", b" GET_LOCK(", b" WHERE k = ",
    b" LIMIT 1", b" AND ", b" OR ", b" IN (", b"\xff", b"\xc3\xa9", b"\xed\xa0\x80", b"\x00",
    b"\xfe\xff\xff\xff\xff\xff\xff\xff\x0f", b"\xfc\xff\xff", b"\xfd\xff\xff\xff", b"\x00\x00\x00\x00",
    b"\xff\xff\xff\x00", b"\x07\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00", b"\x05\x00\x00\x02\xfe\x00\x00\x02\x00",
]  # fmt: skip


class Mutator:
    def __init__(self, seeds: list[bytes], seed: int = 0, max_len: int = 4096) -> None:
        self.seeds = [s for s in seeds] or [b""]
        self.rng = random.Random(seed)
        self.max_len = max_len

    def next(self) -> bytes:
        rng = self.rng
        roll = rng.random()
        if roll < 0.05:
            return bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64)))
        data = bytearray(rng.choice(self.seeds))
        for _ in range(rng.randint(1, 5)):
            self._mutate(data)
        return bytes(data[: self.max_len])

    def _mutate(self, data: bytearray) -> None:
        rng = self.rng
        op = rng.randrange(11)
        n = len(data)
        pos = rng.randint(0, n)
        if op == 0 and n:
            data[min(pos, n - 1)] ^= 1 << rng.randrange(8)
        elif op == 1 and n:
            data[min(pos, n - 1)] = rng.choice(_BYTES)
        elif op == 2:
            data[pos:pos] = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 8)))
        elif op == 3 and n:
            del data[pos : pos + rng.randint(1, 16)]
        elif op == 4 and n:
            end = rng.randint(pos, n)
            data[end:end] = data[pos:end]
        elif op == 5:
            del data[rng.randint(0, n) :]
        elif op == 6:
            other = rng.choice(self.seeds)
            a = rng.randint(0, len(other))
            data[pos:] = other[a:]
        elif op == 7 and n >= 3:
            p = min(pos, n - 3)
            length = rng.choice(_LENGTHS) if rng.random() < 0.7 else rng.randint(0, 64)
            data[p : p + 3] = length.to_bytes(3, "little")
        elif op == 8:
            data[pos:pos] = rng.choice(_TOKENS)
        elif op == 9 and n:
            data[0] = rng.getrandbits(8)  # the options byte(s)
            if n > 1 and rng.random() < 0.5:
                data[1] = rng.getrandbits(8)
        else:
            token = rng.choice(_TOKENS)
            data[pos : pos + len(token)] = token
