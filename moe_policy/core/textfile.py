"""Reading a policy, model or matrix file: a regular file, of bounded size, in UTF-8.

The file's type is checked before it is opened, and again on the open descriptor, so a
FIFO, a device (``/dev/zero``), a directory or a socket is refused at once instead of
blocking or reading forever; the descriptor is opened non-blocking in case the path is
swapped in between. Every failure is one ``PolicyError`` naming the file, and, for text
that is not UTF-8, the line and column of the first bad byte.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from moe_policy.core.origin import Origin
from moe_policy.errors import PolicyError

#: Largest file read (a policy of ten thousand rules is about 1.5 MB).
MAX_FILE_BYTES = 8 * 1024 * 1024

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _os_error(exc: OSError, shown: str) -> PolicyError:
    origin = Origin.file(shown)
    if exc.errno == errno.ENOENT:
        return PolicyError("file not found", origin, code="file-not-found")
    if exc.errno == errno.ENAMETOOLONG:
        longest = max((len(part.encode()) for part in Path(shown).parts), default=0)
        detail = f"a name of {longest} bytes" if longest > 255 else f"{len(shown.encode())} bytes"
        return PolicyError(
            f"cannot read file: the path is too long ({detail})", origin, code="unreadable"
        )
    reason = exc.strerror or type(exc).__name__
    return PolicyError(f"cannot read file: {reason}", origin, code="unreadable")


def _not_regular(mode: int, shown: str) -> PolicyError:
    return PolicyError(
        f"cannot read file: it is {_kind(mode)}, not a regular file",
        Origin.file(shown),
        code="unreadable",
    )


def _too_large(size: str, shown: str) -> PolicyError:
    return PolicyError(
        f"file too large: {size} bytes (at most {MAX_FILE_BYTES:,})",
        Origin.file(shown),
        code="too-large",
    )


def check_regular(path: str | Path, shown: str | None = None) -> os.stat_result:
    """``os.stat`` of a regular file; anything else (missing, unreadable, too long a
    path, a FIFO, a device, a directory) is a PolicyError naming ``shown``."""
    shown = shown or str(path)
    try:
        info = os.stat(path)
    except ValueError:  # an embedded NUL byte
        raise PolicyError(
            "cannot read file: the path contains a NUL byte", Origin.file(shown), code="unreadable"
        ) from None
    except OSError as exc:
        raise _os_error(exc, shown) from None
    if not stat.S_ISREG(info.st_mode):
        raise _not_regular(info.st_mode, shown)
    return info


def read_bytes(path: str | Path, shown: str | None = None) -> bytes:
    """The bytes of a regular file of at most ``MAX_FILE_BYTES``."""
    shown = shown or str(path)
    info = check_regular(path, shown)
    if info.st_size > MAX_FILE_BYTES:
        raise _too_large(f"{info.st_size:,}", shown)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise _os_error(exc, shown) from None
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            raise _not_regular(opened.st_mode, shown)
        chunks: list[bytes] = []
        left = MAX_FILE_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise _os_error(exc, shown) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_FILE_BYTES:
        raise _too_large(f"more than {MAX_FILE_BYTES:,}", shown)
    return data


def decode_utf8(data: bytes, shown: str) -> str:
    """``data`` as text; invalid UTF-8 is a PolicyError at the line:col of the bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        col = len(data[line_start : exc.start].decode("utf-8", errors="replace")) + 1
        raise PolicyError(
            f"invalid UTF-8: byte 0x{data[exc.start]:02x} ({exc.reason})",
            Origin.file(shown, line, col),
            code="malformed-yaml",
        ) from None


def read_text(path: str | Path, shown: str | None = None) -> str:
    """A regular UTF-8 file of at most ``MAX_FILE_BYTES`` as text (see the module)."""
    shown = shown or str(path)
    return decode_utf8(read_bytes(path, shown), shown)
