"""One writer per output (`OutputLock`) and the manifest beside it: the settings that
decide the rows, the input's sha256 (hashed while the model loads), whether the run completed."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import stat
import threading
from pathlib import Path
from typing import Any

from ...ground.errors import OutputError
from ...ground.jsonfiles import utc_now, write_json_atomic
from ...ground.notices import notice
from ...ground.safefs import open_nofollow, refuse_symlink
from ...ground.textfiles import InputError
from ...ground.version import __version__
from .paths import same_file

MANIFEST_SUFFIX = ".mlx-slm.json"
LOCK_SUFFIX = ".lock"
MANIFEST_VERSION = 1


class OutputLock:
    """An exclusive lock on the output for the run, released on any exit.

    The lock is taken on the output file itself (created empty if need be), so every path
    to it (a symlink, a hard link) meets the same lock; `OUT.lock` beside its real path
    names the holder for the message a second run prints.

    `create=False` (Parquet, which appears only when complete): an output that is not
    there is not created for the lock; the lock file alone keeps a second run out (a task
    file, `--save-task`, is locked so too: `option` names the option in the messages).
    """

    def __init__(self, path: str, create: bool = True, option: str = "-o"):
        self.target = path
        self.option = option
        self.create = create
        self.path = os.path.realpath(path) + LOCK_SUFFIX
        self.fd: int | None = None
        self.out_fd: int | None = None
        self.created = False

    def __enter__(self) -> OutputLock:
        # Nothing of ours is written through a link someone placed beside the output.
        for p, what in (
            (self.target, self.option),
            (self.path, "the lock file"),
            (str(manifest_path(self.target)), "the manifest"),
        ):
            refuse_symlink(p, what)
        try:
            self.created = not os.path.lexists(self.target)
            if self.create or not self.created:
                self.out_fd = open_nofollow(self.target, os.O_RDWR | (os.O_CREAT if self.create else 0), self.option)
        except OSError as e:
            raise OutputError(f"{self.option} {self.target}: cannot open it for writing ({e.strerror})") from None
        try:
            if self.out_fd is not None:
                fcntl.flock(self.out_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.out_fd)  # type: ignore[arg-type]
            self.out_fd = None
            raise self._busy() from None
        try:
            self._note_holder()
        except BlockingIOError:  # the lock file is held (for a Parquet output not yet written, the only lock)
            self.__exit__(None, None, None)
            raise self._busy() from None
        except OutputError:
            self.__exit__(OutputError, None, None)
            raise
        except OSError as e:
            self.__exit__(None, None, None)
            raise OutputError(
                f"{self.option} {self.target}: cannot write its lock file {self.path} ({e.strerror})"
            ) from None
        return self

    def _busy(self) -> OutputError:
        """The error for an output another run holds, naming the holder its lock file records."""
        try:
            fd = open_nofollow(self.path, os.O_RDONLY)
            with os.fdopen(fd, "rb") as f:
                holder = f.read(500).decode("utf-8", errors="replace").strip()
        except (OSError, OutputError):
            holder = ""
        return OutputError(
            f"{self.target} is being written by another mlx-slm run ({holder or 'another process'}); "
            f"wait for it to finish, or choose another {self.option}"
        )

    def _note_holder(self) -> None:
        while True:
            fd = open_nofollow(self.path, os.O_RDWR | os.O_CREAT, "the lock file")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # a holder through another path that reached the same file first
                os.close(fd)
                raise
            # The holder before us may have removed the file between our open and flock:
            # then we hold a lock on an orphan; try again on the file now at the path.
            try:
                if same_file(os.fstat(fd), os.stat(self.path)):
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        # A finished run removes its lock file; one still there, with a holder named and nobody
        # holding it, is a run that was killed or crashed (the kernel dropped its flock): say so.
        stale = os.pread(fd, 500, 0).decode("utf-8", errors="replace").strip()
        if stale:
            notice(
                f"mlx-slm: note: the run that last wrote {self.target} ({stale}) stopped without finishing "
                "(killed or crashed); its lock is taken over"
            )
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {utc_now()}\n".encode())
        self.fd = fd

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if self.fd is not None:
            try:
                os.unlink(self.path)  # while still locked, so nobody locks the old inode after us
            except FileNotFoundError:
                pass
            os.close(self.fd)
            self.fd = None
        if self.out_fd is not None:
            # A run that failed before writing anything leaves no empty file it created.
            if exc_type is not None and self.created and os.fstat(self.out_fd).st_size == 0:
                try:
                    os.unlink(self.target)
                except FileNotFoundError:
                    pass
            os.close(self.out_fd)
            self.out_fd = None


def manifest_path(output: str) -> Path:
    return Path(output + MANIFEST_SUFFIX)


def write_manifest(
    output: str, settings: dict[str, Any], complete: bool, rows: int | None = None, fitted: dict | None = None
) -> None:
    """Write the manifest atomically (a torn manifest would make the output unresumable).

    A completed run also records the sha256 of the output's bytes (`output_sha256`):
    `merge` refuses a part whose rows were changed since."""

    doc = {
        "manifest_version": MANIFEST_VERSION,
        "tool": f"mlx-slm {__version__}",
        "output": os.path.basename(output),
        "settings": settings,
        "complete": complete,
        "rows": rows,
        # A prior fitted on this input's warm-up (batch/em calibration): a resumed run reuses it.
        "fitted_calibrator": fitted,
        "updated": utc_now(),
    }
    if complete:
        doc["output_sha256"] = output_sha256(output)
    try:
        write_json_atomic(manifest_path(output), doc)
    except OSError as e:
        raise OutputError(f"cannot write {manifest_path(output)} ({e.strerror})") from None


NOT_HASHED_STDIN = "standard input: read once, so its content is not hashed"
NOT_HASHED_STREAM = "a stream (a pipe or a device), read once, so its content is not hashed"


def input_sha256(path: str | None) -> tuple[str | None, str | None]:
    """(sha256 of an input file's bytes, None), streamed in 4 MiB blocks; (None, why not) for
    standard input or a stream that cannot be read twice. The manifest pins it, so `--resume`,
    `eval --predictions` and `merge` notice an input edited in place, at the same size too."""
    if path in (None, "-"):
        return None, NOT_HASHED_STDIN
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None, NOT_HASHED_STREAM
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
    except OSError as e:
        raise InputError(f"cannot read the input {path} to record its content ({e.strerror})") from None
    return h.hexdigest(), None


class InputDigest:
    """`input_sha256` computed on a daemon thread while the model loads (one streaming pass
    over the file, overlapped with other work; a daemon, so Ctrl-C does not wait for it)."""

    def __init__(self, path: str | None):
        self._result: tuple[str | None, str | None] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(path,), daemon=True, name="mlx-slm input sha256")
        self._thread.start()

    def _run(self, path: str | None) -> None:
        try:
            self._result = input_sha256(path)
        except BaseException as e:  # noqa: BLE001 - handed to the caller of result()
            self._error = e

    def result(self) -> tuple[str | None, str | None]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


def input_changed(path: str, recorded: dict[str, Any], current: tuple[str | None, int | None]) -> str | None:
    """How the input differs from what a manifest's settings recorded (sha256, size), or None.

    An input the manifest did not hash (standard input, a pipe, an older mlx-slm) cannot be
    checked and is not refused here."""
    sha, size = current
    old_sha, old_size = recorded.get("input_sha256"), recorded.get("input_size")
    if not isinstance(old_sha, str) or sha is None or sha == old_sha:
        return None
    how = f"input_size was {old_size}, now {size}" if old_size != size else "the same size: edited in place"
    return f"the input {path} was changed since (its sha256 is {sha[:12]}..., it was {old_sha[:12]}...; {how})"


def output_sha256(output: str) -> str:
    """sha256 of an output file's bytes (header and rows), read without following a link."""
    h = hashlib.sha256()
    try:
        with os.fdopen(open_nofollow(output, os.O_RDONLY, "-o"), "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
    except OSError as e:
        raise OutputError(f"cannot read back {output} ({e.strerror})") from None
    return h.hexdigest()


def read_manifest(output: str) -> dict[str, Any] | None:
    p = manifest_path(output)
    if not p.exists():
        return None
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))  # UnicodeDecodeError is a ValueError
        _check_manifest(doc)
    except (ValueError, RecursionError, OSError) as e:
        e = "nested too deeply" if isinstance(e, RecursionError) else e.strerror if isinstance(e, OSError) else e
        raise OutputError(
            f"{p} is not a readable mlx-slm manifest ({e}): delete it and the output to start again"
        ) from None
    return doc


def _check_manifest(doc: Any) -> None:
    """Raise ValueError naming the first field of a manifest with the wrong type (an edited file)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("settings"), dict):
        raise ValueError("no settings")
    version = doc.get("manifest_version", 1)
    if isinstance(version, bool) or not isinstance(version, int):
        raise ValueError(f"field 'manifest_version' is {version!r}, not an integer")
    if version > MANIFEST_VERSION:
        raise ValueError(f"manifest version {version}, newer than this mlx-slm reads")
    for key, ok, want in (
        ("complete", lambda v: isinstance(v, bool), "true or false"),
        ("rows", lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0), "a count"),
        ("fitted_calibrator", lambda v: v is None or isinstance(v, dict), "an object or null"),
    ):
        if key in doc and not ok(doc[key]):
            raise ValueError(f"field {key!r} is {doc[key]!r}, not {want}")


def changed_settings(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Names of the settings that differ, in the new settings' order."""
    return [k for k in new if old.get(k, "<missing>") != new[k]] + [k for k in old if k not in new]
