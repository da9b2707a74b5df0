"""A file system whose lookups stall until released: a real mount, served by this process over /dev/fuse.

It stands in for an NFS (or any network) volume whose server stops answering: there, as here, a stat or open of a
path on the volume sleeps in the kernel until the server replies, with no error and no timeout the caller chose.
A FIFO does not: stat() answers at once for one, and only open() of it blocks. So the mount speaks the kernel's
FUSE protocol itself (no libfuse, no Python binding): it answers the handshake and the root's attributes, and holds
every LOOKUP of a name until `release()`, when each held one and every later one is answered ENOENT ("the file is
gone"). Mounting needs root (CAP_SYS_ADMIN), as the tmpfs tests do; without it `missing()` skips, or fails on CI.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helpers import missing

# include/uapi/linux/fuse.h: the headers every request and reply starts with, and the opcodes answered here.
IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
OUT_HEADER = struct.Struct("<IiQ")  # len, error (minus an errno), unique
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr: ino, size, blocks, times, their ns, mode, nlink, ...
LOOKUP, FORGET, GETATTR, INIT, INTERRUPT, DESTROY, BATCH_FORGET = 1, 2, 3, 26, 36, 38, 42
NO_REPLY = (FORGET, INTERRUPT, BATCH_FORGET)
ROOT = 1
BUFFER = 1 << 20  # the kernel refuses a read smaller than a request can be
# Without it the kernel sends one lookup per directory at a time (the others wait in the kernel, unseen here).
PARALLEL_DIROPS = 1 << 18


class StallingFs:
    """The mount's server: a thread reading requests from /dev/fuse, replying from whichever thread decides."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self._held: list[int] = []  # the `unique` of each LOOKUP not yet answered
        self._released = False
        self.stalled = threading.Event()  # set when the first lookup is held: a caller is now asleep in the kernel
        self._thread = threading.Thread(target=self._serve, name="fuse-stall", daemon=True)
        self._thread.start()

    @property
    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def release(self) -> None:
        """Every held lookup and every later one answered ENOENT, as a volume back with the file gone."""
        with self._lock:
            self._released = True
            held, self._held = self._held, []
        for unique in held:
            self._reply(unique, -errno.ENOENT)

    def _reply(self, unique: int, error: int = 0, payload: bytes = b"") -> None:
        try:
            os.write(self._fd, OUT_HEADER.pack(OUT_HEADER.size + len(payload), error, unique) + payload)
        except OSError as exc:  # ENOENT: the caller was interrupted; ENODEV: unmounted meanwhile
            if exc.errno not in (errno.ENOENT, errno.ENODEV):
                raise

    def _serve(self) -> None:
        while True:
            try:
                request = os.read(self._fd, BUFFER)
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                return  # ENODEV: unmounted
            if not request:
                return
            _, opcode, unique, nodeid, *_ = IN_HEADER.unpack_from(request)
            body = request[IN_HEADER.size :]
            if opcode in NO_REPLY:
                continue
            if opcode == INIT:
                (minor,) = struct.unpack_from("<I", body, 4)  # after the major version
                # fuse_init_out: major, minor (no newer than this code knows), max_readahead, flags, max_background,
                # congestion_threshold, max_write, time_gran, max_pages, map_alignment, flags2, stack depth, unused.
                init = struct.pack(
                    "<IIIIHHIIHHII24x", 7, min(minor, 31), 0, PARALLEL_DIROPS, 16, 12, 4096, 1, 0, 0, 0, 0
                )
                self._reply(unique, 0, init)
            elif opcode == GETATTR and nodeid == ROOT:
                root = ATTR.pack(ROOT, 0, 0, 0, 0, 0, 0, 0, 0, stat.S_IFDIR | 0o755, 2, 0, 0, 0, 4096, 0)
                self._reply(unique, 0, struct.pack("<QII", 0, 0, 0) + root)  # attr_valid 0: asked again each time
            elif opcode == LOOKUP:
                with self._lock:
                    if not self._released:
                        self._held.append(unique)
                        self.stalled.set()
                        continue
                self._reply(unique, -errno.ENOENT)
            elif opcode == DESTROY:
                self._reply(unique)
                return
            else:
                self._reply(unique, -errno.ENOSYS)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


@contextmanager
def stalling_mount(mount_point: Path) -> Iterator[StallingFs]:
    """`mount_point` (an empty directory) mounted as a StallingFs; released and unmounted on leaving."""
    mount_point.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        missing(f"/dev/fuse ({exc.strerror})", "run the tests as root on a kernel with FUSE, as CI does")
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"fd={fd},rootmode={stat.S_IFDIR:o},user_id={os.getuid()},group_id={os.getgid()}".encode()
    if libc.mount(b"visioncap-stall", str(mount_point).encode(), b"fuse", 0, options) != 0:
        problem = os.strerror(ctypes.get_errno())
        os.close(fd)
        missing(f"a FUSE mount ({problem})", "run the tests as root on a kernel with FUSE, as CI does")
    fs = StallingFs(fd)
    try:
        yield fs
    finally:
        fs.release()
        # Lazy: a caller still inside the mount does not keep it; the server's read then ends with ENODEV.
        subprocess.run(["umount", "-l", str(mount_point)], check=False, capture_output=True)
        fs.join(10)
        os.close(fd)
