"""Creating files where others may write too: never through a link, never half-written.

Every file mlx-slm writes (an output and its lock and manifest, a merged output, a task,
a report, plots, the model cache) goes through one of these:

* `atomic_writer` / `atomic_write`: the content goes into a temporary file created
  exclusively (`mkstemp`: `O_EXCL`, a random name) in the destination's own folder, and
  is renamed over the destination once complete. Readers see the old file or the new,
  never half of one; a name someone placed beside ours in advance (`OUT.tmp`,
  `OUT.partial`) is never used, so a link there aims nothing.
* `open_nofollow`: an existing file opened in place (an output being appended to, a
  lock file) with `O_NOFOLLOW`, and refused unless it is a regular file.
* `refuse_symlink`: a symbolic link where we are about to write is an error, not
  something to follow (in a shared folder such as /tmp anyone can place one).
* `temp_dir`: a private folder (mode 0700, random name) beside a destination, to be
  renamed into place when complete.
* `FileLock`: an exclusive `flock` on a lock file opened with `O_NOFOLLOW`, waiting (with
  a one-line message) for another process that holds it.

Refusals are `UnsafePathError` (a `UserError`: the CLI prints one line and exits 2).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from .errors import OutputError
from .notices import notice

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # opening a FIFO placed where a file is expected must not hang

# The mode a plain open() would give a new file (0666 less the umask); mkstemp gives 0600.
_UMASK = os.umask(0o022)
os.umask(_UMASK)
FILE_MODE = 0o666 & ~_UMASK
DIR_MODE = 0o777 & ~_UMASK


class UnsafePathError(OutputError):
    """A path where mlx-slm would write is a link, or not a regular file or folder as expected."""


def _name(path: str | os.PathLike, what: str | None) -> str:
    return f"{what} {path}" if what else str(path)


def refuse_symlink(path: str | os.PathLike, what: str | None = None) -> None:
    """Raise UnsafePathError if `path` itself (its last component) is a symbolic link."""
    if os.path.islink(path):
        try:
            to = f" (to {os.readlink(path)})"
        except OSError:
            to = ""
        raise UnsafePathError(
            f"{_name(path, what)} is a symbolic link{to}: mlx-slm does not write through links "
            "(in a shared folder anyone can aim one at your files); remove it or choose another path"
        )


def _refused(path: str | os.PathLike, what: str | None, e: OSError) -> OutputError:
    if e.errno in (errno.ELOOP, errno.EMLINK):  # O_NOFOLLOW on a link (EMLINK: FreeBSD)
        return UnsafePathError(
            f"{_name(path, what)} is a symbolic link: mlx-slm does not write through links; "
            "remove it or choose another path"
        )
    return OutputError(f"cannot write {_name(path, what)} ({e.strerror or e})")


def open_nofollow(path: str | os.PathLike, flags: int, what: str | None = None) -> int:
    """`os.open(path, flags)` that refuses a symbolic link and anything but a regular file.

    Returns the descriptor. OSErrors other than a refusal are raised as they are (the
    caller knows what a missing file means for it)."""
    try:
        fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC | _NONBLOCK, FILE_MODE)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK):
            raise _refused(path, what, e) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError(f"{_name(path, what)} is not a regular file: remove it or choose another path")
        if _NONBLOCK:  # a regular file: back to ordinary blocking I/O
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_destination(p: Path, what: str | None) -> None:
    refuse_symlink(p, what)
    if p.is_dir():
        raise OutputError(f"{_name(p, what)} is a folder: give a file path")
    if p.exists() and not p.is_file():  # a device or a FIFO: renaming over it would replace it (as root, /dev/null)
        raise OutputError(
            f"{_name(p, what)} is not a regular file (a device, a FIFO or a socket): this output is written whole "
            "and renamed into place; give a file path"
        )
    parent = p.parent
    if not parent.is_dir():
        raise OutputError(f"{_name(p, what)}: the folder {parent} does not exist: create it first")


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike, mode: str = "wb", what: str | None = None, **kw: Any) -> Iterator[IO[Any]]:
    """A file object whose content replaces `path` when the block ends without an error.

    The temporary file is made by `mkstemp` in `path`'s folder (so the rename is atomic);
    on any error it is removed and `path` is left as it was. A link at `path` is refused."""
    p = Path(path)
    _check_destination(p, what)
    try:
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".partial")
    except OSError as e:
        raise OutputError(
            f"cannot write {_name(p, what)}: cannot create a file in {p.parent} ({e.strerror or e})"
        ) from None
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, mode, **kw) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        refuse_symlink(p, what)  # placed while we wrote: os.replace would not follow it, but say so
        os.replace(tmp, p)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and not isinstance(e, BrokenPipeError):
            raise OutputError(f"cannot write {_name(p, what)} ({e.strerror or e})") from None
        raise


def atomic_write(path: str | os.PathLike, data: bytes | str, what: str | None = None) -> None:
    """Replace `path` with `data` (str: UTF-8) atomically; see `atomic_writer`."""
    with atomic_writer(path, "wb", what) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def write_json_atomic(path: str | os.PathLike, doc: Any, what: str | None = None) -> None:
    """JSON (indented, UTF-8) through `atomic_write`."""
    atomic_write(path, json.dumps(doc, indent=2, ensure_ascii=False) + "\n", what)


def temp_dir(dest: str | os.PathLike, what: str | None = None) -> Path:
    """A new private folder (0700, random name) beside `dest`, to fill and rename to `dest`."""
    p = Path(dest)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=p.parent, prefix=f".{p.name}.", suffix=".partial"))
    except OSError as e:
        raise OutputError(
            f"cannot write {_name(p, what)}: cannot create a folder in {p.parent} ({e.strerror or e})"
        ) from None


class FileLock:
    """An exclusive inter-process lock (`flock`) on `path`, waited for.

    The lock file is opened with `O_NOFOLLOW` (a link there is refused) and kept after
    release: removing it would let two processes lock two different files. The kernel
    drops the lock when its holder exits, however it exits. `waiting` is printed (one
    line, on stderr) when another process holds the lock and we wait for it.
    """

    def __init__(self, path: str | os.PathLike, waiting: str | None = None, say: Callable[[str], None] | None = None):
        self.path = Path(path)
        self.waiting = waiting
        self.say = say or notice
        self.fd: int | None = None

    def __enter__(self) -> FileLock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = open_nofollow(self.path, os.O_RDWR | os.O_CREAT, "lock file")
        except OSError as e:
            raise OutputError(f"cannot open the lock file {self.path} ({e.strerror or e})") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if self.waiting:
                    self.say(self.waiting)
                fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = None
