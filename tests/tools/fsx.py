#!/usr/bin/env python3
"""fsx.py: a seeded file-system exerciser in the manner of Apple/BSD fsx.

It applies a random sequence of operations to one file -- writes, reads, truncations up and down, mmap reads
and writes, fsync, close and reopen, reads through a second descriptor -- and mirrors every change in an
in-memory model of the file. After each operation the file's size (fstat) must equal the model's, and every
read must return the model's bytes. On the first mismatch it prints the seed, the operations that led there
and the first differing offset, and exits 1. The same seed replays the same sequence exactly.

Offsets and lengths are biased towards the edges where block stores go wrong: multiples of 4 KiB and of
bftfs's 64 KiB data block, plus or minus one, the current end of file, and beyond it (holes).

    python3 tests/tools/fsx.py /mnt/bftfs/fsx.dat --ops 100000          # by hand, long
    python3 tests/tools/fsx.py FILE --seed 1234 --ops 5000 --log-last 50  # replay one failure
    python3 tests/tools/fsx.py FILE --no-mmap                            # when the mount has no mmap

Exit status: 0 every check passed; 1 a mismatch (the report is on stdout); 2 bad arguments or an unexpected
OSError from the file system (printed with the op log, like a mismatch).
"""

from __future__ import annotations

import argparse
import collections
import mmap
import os
import random
import sys
import time

BLOCK = 65536
PAGE = mmap.PAGESIZE


class Mismatch(Exception):
    pass


class Exerciser:
    def __init__(self, path: str, seed: int, max_size: int, use_mmap: bool, log_last: int,
                 corrupt_at: int | None) -> None:
        self.path = path
        self.seed = seed
        self.rng = random.Random(seed)
        self.max_size = max_size
        self.use_mmap = use_mmap
        self.model = bytearray()
        self.log: collections.deque[str] = collections.deque(maxlen=log_last)
        self.corrupt_at = corrupt_at   # test hook: change one byte behind the model's back at this op
        self.counts: collections.Counter[str] = collections.Counter()
        self.op_index = 0
        self.fd = -1
        self.rfd = -1
        self.stamp = 0

    # ---- set-up ----
    def open(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self.rfd = os.open(self.path, os.O_RDONLY)

    def close(self) -> None:
        for fd in (self.fd, self.rfd):
            if fd >= 0:
                os.close(fd)
        self.fd = self.rfd = -1

    # ---- choosing offsets and lengths ----
    def _edge(self, limit: int) -> int:
        r = self.rng.random()
        if r < 0.35:
            return self.rng.randrange(limit + 1)
        unit = self.rng.choice((512, 4096, BLOCK))
        base = unit * self.rng.randrange(limit // unit + 1)
        return max(0, min(limit, base + self.rng.choice((-1, 0, 0, 1))))

    def _offset(self) -> int:
        size = len(self.model)
        r = self.rng.random()
        if r < 0.15 and size:
            return max(0, size - self.rng.randrange(1, min(size, 2 * BLOCK) + 1))   # near the end
        if r < 0.25:
            return min(self.max_size - 1, size + self.rng.randrange(0, 3 * BLOCK))   # beyond: a hole
        return self._edge(max(0, min(self.max_size - 1, max(size, 1) * 2)))

    def _length(self, offset: int) -> int:
        r = self.rng.random()
        if r < 0.5:
            n = self.rng.randrange(1, 4097)
        elif r < 0.85:
            n = self.rng.randrange(1, 2 * BLOCK + 2)
        else:
            n = self.rng.choice((BLOCK, BLOCK - 1, BLOCK + 1, 4096, 3 * BLOCK))
        return max(1, min(n, self.max_size - offset))

    def _data(self, n: int) -> bytes:
        self.stamp += 1
        head = f"[{self.op_index}]".encode()
        body = bytes((self.stamp * 37 + i * 11 + (i >> 9)) & 0xFF for i in range(min(n, 256)))
        out = (head + body * (n // max(1, len(body)) + 1))[:n]
        return out

    # ---- checks ----
    def _check_size(self, what: str) -> None:
        for fd, name in ((self.fd, "rw fd"), (self.rfd, "read fd")):
            st = os.fstat(fd).st_size
            if st != len(self.model):
                raise Mismatch(f"{what}: fstat({name}).st_size = {st}, model size {len(self.model)}")

    def _compare(self, got: bytes, offset: int, n: int, what: str) -> None:
        want = bytes(self.model[offset:offset + n])
        if got == want:
            return
        for i in range(min(len(got), len(want))):
            if got[i] != want[i]:
                at = offset + i
                raise Mismatch(f"{what}: first difference at file offset {at} (0x{at:x}; block {at // BLOCK} "
                               f"+ {at % BLOCK}): got {got[i:i + 16].hex()} want {want[i:i + 16].hex()}")
        raise Mismatch(f"{what}: got {len(got)} bytes, model has {len(want)} at offset {offset}")

    # ---- operations ----
    def op_write(self) -> None:
        off = self._offset()
        n = self._length(off)
        data = self._data(n)
        self.log.append(f"{self.op_index}: write off={off} len={n} (size {len(self.model)})")
        view = memoryview(data)
        pos = off
        while view:
            k = os.pwrite(self.fd, view, pos)
            view, pos = view[k:], pos + k
        if len(self.model) < off + n:
            self.model.extend(bytes(off + n - len(self.model)))
        self.model[off:off + n] = data

    def op_read(self, fd_name: str = "rw") -> None:
        size = len(self.model)
        off = self._edge(size + BLOCK) if size else 0
        n = self._length(min(off, self.max_size - 1))
        fd = self.fd if fd_name == "rw" else self.rfd
        self.log.append(f"{self.op_index}: read({fd_name}) off={off} len={n} (size {size})")
        out = bytearray()
        while len(out) < n:
            chunk = os.pread(fd, n - len(out), off + len(out))
            if not chunk:
                break
            out += chunk
        self._compare(bytes(out), off, n, f"read({fd_name}) off={off} len={n}")

    def op_truncate(self) -> None:
        size = len(self.model)
        r = self.rng.random()
        if r < 0.4:
            new = self._edge(size)                            # down
        elif r < 0.5:
            new = 0
        else:
            new = min(self.max_size, self._edge(size + 3 * BLOCK))   # up (or anywhere)
        self.log.append(f"{self.op_index}: truncate {size} -> {new}")
        os.ftruncate(self.fd, new)
        if new < size:
            del self.model[new:]
        else:
            self.model.extend(bytes(new - size))

    def op_mapread(self) -> None:
        size = len(self.model)
        if size == 0:
            return self.op_read()
        off = self.rng.randrange(size)
        n = min(self._length(off), size - off)
        base = off - off % PAGE
        self.log.append(f"{self.op_index}: mapread off={off} len={n} (size {size})")
        with mmap.mmap(self.fd, off + n - base, mmap.MAP_SHARED, mmap.PROT_READ, offset=base) as m:
            got = m[off - base:off - base + n]
        self._compare(got, off, n, f"mapread off={off} len={n}")

    def op_mapwrite(self) -> None:
        off = self._offset()
        n = self._length(off)
        end = off + n
        self.log.append(f"{self.op_index}: mapwrite off={off} len={n} (size {len(self.model)})")
        if end > len(self.model):     # a mapping cannot extend a file: grow it first, as fsx does
            os.ftruncate(self.fd, end)
            self.model.extend(bytes(end - len(self.model)))
        data = self._data(n)
        base = off - off % PAGE
        with mmap.mmap(self.fd, end - base, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                       offset=base) as m:
            m[off - base:end - base] = data
            m.flush()
        self.model[off:end] = data

    def op_fsync(self) -> None:
        self.log.append(f"{self.op_index}: fsync")
        os.fsync(self.fd)

    def op_reopen(self) -> None:
        self.log.append(f"{self.op_index}: close and reopen both fds")
        self.close()
        self.fd = os.open(self.path, os.O_RDWR)
        self.rfd = os.open(self.path, os.O_RDONLY)

    def run(self, ops: int, quiet: bool) -> None:
        table = [(self.op_write, 30), (self.op_read, 20), (lambda: self.op_read("ro"), 10),
                 (self.op_truncate, 10), (self.op_fsync, 3), (self.op_reopen, 3)]
        if self.use_mmap:
            table += [(self.op_mapread, 8), (self.op_mapwrite, 8)]
        fns = [f for f, _ in table]
        weights = [w for _, w in table]
        names = ["write", "read", "read2", "truncate", "fsync", "reopen", "mapread", "mapwrite"]
        start = time.monotonic()
        for self.op_index in range(1, ops + 1):
            k = self.rng.choices(range(len(fns)), weights)[0]
            fns[k]()
            self.counts[names[k]] += 1
            if self.corrupt_at == self.op_index and self.model:
                at = self.rng.randrange(len(self.model))
                os.pwrite(self.fd, bytes([self.model[at] ^ 0x5A]), at)
                self.log.append(f"{self.op_index}: (test hook) corrupted byte {at} behind the model's back")
            self._check_size(f"after op {self.op_index}")
            if not quiet and self.op_index % 1000 == 0:
                print(f"fsx: {self.op_index} ops, size {len(self.model)}, {time.monotonic() - start:.1f}s",
                      flush=True)
        # a final full comparison through a fresh descriptor
        self.op_index = ops + 1
        self.log.append(f"{self.op_index}: final full read through a new fd")
        with open(self.path, "rb") as f:
            self._compare(f.read(), 0, len(self.model), "final full read")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", help="the file to exercise (created or truncated)")
    ap.add_argument("--ops", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    ap.add_argument("--max-size", type=int, default=4 * 1024 * 1024, help="largest file size in bytes")
    ap.add_argument("--no-mmap", action="store_true", help="no mmap reads or writes")
    ap.add_argument("--log-last", type=int, default=40, help="ops printed on a failure")
    ap.add_argument("--corrupt-at", type=int, default=None,
                    help="test hook: corrupt one byte behind the model's back after this op (must be detected)")
    ap.add_argument("--keep", action="store_true", help="keep the file afterwards")
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args(argv)
    if args.ops < 1 or args.max_size < 2 * BLOCK:
        print("fsx: --ops must be >= 1 and --max-size >= 131072", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    ex = Exerciser(args.file, seed, args.max_size, not args.no_mmap, args.log_last, args.corrupt_at)
    status = 0
    try:
        ex.open()
        ex.run(args.ops, args.quiet)
    except (Mismatch, OSError) as e:
        status = 1 if isinstance(e, Mismatch) else 2
        kind = "MISMATCH" if status == 1 else "UNEXPECTED ERROR"
        print(f"fsx: {kind} at op {ex.op_index} (seed {seed}): {e}")
        print(f"fsx: last {len(ex.log)} ops (replay: fsx.py FILE --seed {seed} --ops {ex.op_index} "
              f"--max-size {args.max_size}{' --no-mmap' if args.no_mmap else ''}):")
        for line in ex.log:
            print(f"  {line}")
    finally:
        ex.close()
        if not args.keep and status == 0:
            try:
                os.unlink(args.file)
            except OSError:
                pass
    if status == 0:
        summary = " ".join(f"{k}={v}" for k, v in sorted(ex.counts.items()))
        print(f"fsx: ok, seed {seed}, {args.ops} ops ({summary}), final size {len(ex.model)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
