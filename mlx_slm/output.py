"""Writing predictions safely: one writer per output, never over an input, and exact resume.

An output file (`-o FILE`) has two companions next to it:

* `FILE.lock`, held with an exclusive `flock` for the whole run, so a second run on the
  same output stops at once and names the holder. The kernel drops the lock when the
  process dies, however it dies; the file itself is removed on a clean exit.
* `FILE.mlx-slm.json`, the *manifest*: everything that decides the rows (model and weight
  hash, labels, prompt, scoring, calibration, batching, the input's path, size and
  sha256), and whether the run completed. `--resume` refuses a file without one (not ours: it is left
  untouched) or whose settings differ (naming the field).

Resume is keyed by input position, not by id: output row *i* is input row *i*. The rows
already written are checked against the input's ids, then the file is cut back to the
start of the last unfinished window of items, so every item is sorted and batched with
exactly the neighbours it has in an uninterrupted run: a resumed file is byte-identical
to an uninterrupted one, error rows included.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import socket
import stat
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ._fs import utc_now, write_json_atomic
from .calibration import PROB_DIGITS, written
from .errors import OutputError
from .safefs import open_nofollow, refuse_symlink

OUTPUT_FORMATS = ("jsonl", "csv", "tsv", "parquet")


def delimiter(fmt: str) -> str:
    """The field separator of a delimited output format ("csv" or "tsv")."""
    return "\t" if fmt == "tsv" else ","


_EXTENSIONS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".tsv": "tsv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
MANIFEST_SUFFIX = ".mlx-slm.json"
LOCK_SUFFIX = ".lock"
MANIFEST_VERSION = 1


def output_format(path: str | None, explicit: str | None = None) -> str:
    """The output's format: `explicit`, else from the extension; an unknown extension is an error."""
    if explicit:
        if explicit not in OUTPUT_FORMATS:
            raise OutputError(f"output format {explicit!r} is not one of {', '.join(OUTPUT_FORMATS)}")
        return explicit
    if path in (None, "-"):
        return "jsonl"
    ext = Path(path).suffix.lower()
    if ext not in _EXTENSIONS:
        raise OutputError(
            f"-o {path}: unknown output extension {ext or '(none)'!r}; use .jsonl, .csv, .tsv or .parquet, "
            "or say which with --output-format jsonl|csv|tsv|parquet"
        )
    return _EXTENSIONS[ext]


# --------------------------------------------------------------------------- never over an input


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def is_plain_file_target(output: str | None) -> bool:
    """True for an output that is (or will be) a regular file: it gets a lock and a manifest.

    stdout ('-'), /dev/null, a FIFO or a terminal are written as streams, like stdout.
    """
    if output in (None, "-"):
        return False
    try:
        return stat.S_ISREG(os.stat(output).st_mode)
    except FileNotFoundError:
        return True


def check_writable(path: str, what: str = "-o") -> None:
    """Fail before any work if the file cannot be created where it is asked for (or is a link)."""
    refuse_symlink(path, what)
    if os.path.isdir(path):  # --plots names a folder; every other output is a file
        if what != "--plots":
            raise OutputError(f"{what} {path} is a folder: give a file path")
        if not os.access(path, os.W_OK | os.X_OK):
            raise OutputError(f"{what} {path}: the folder is not writable")
        return
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise OutputError(f"{what} {path}: the folder {parent} does not exist: create it first")
    if not os.access(parent, os.W_OK):
        raise OutputError(f"{what} {path}: the folder {parent} is not writable")


def refuse_input_as_output(output: str, inputs: Sequence[str | None], flag: str = "-o") -> None:
    """Raise if `output` is (a path, symlink or hard link to) any input; checked before opening it.

    `None` or '-' stands for stdin: when stdin is a regular file (`< FILE`), that file counts.
    """
    try:
        out_st = os.stat(output)
    except FileNotFoundError:
        return  # a new file cannot be an input (an input must exist)
    for inp in inputs:
        if inp in (None, "-"):
            try:
                in_st = os.fstat(sys.stdin.fileno())
            except (OSError, ValueError, AttributeError):  # stdin closed or replaced (tests)
                continue
            where = "standard input"
        else:
            try:
                in_st = os.stat(inp)
            except OSError:
                continue
            where = f"the input {inp}"
        if _same_file(out_st, in_st):
            raise OutputError(
                f"{flag} {output} is {where} (the same file{', through a link' if inp not in (None, '-') and os.path.realpath(inp) != os.path.realpath(output) else ''}): "
                "writing it would destroy the input; choose another output file"
            )


# --------------------------------------------------------------------------- one writer per output


class OutputLock:
    """An exclusive lock on the output for the run, released on any exit.

    The lock is taken on the output file itself (created empty if need be), so every path
    to it (a symlink, a hard link) meets the same lock; `OUT.lock` beside its real path
    names the holder for the message a second run prints.

    `create=False` (Parquet, which appears only when complete): an output that is not
    there is not created for the lock; the lock file alone keeps a second run out.
    """

    def __init__(self, path: str, create: bool = True):
        self.target = path
        self.create = create
        self.path = os.path.realpath(path) + LOCK_SUFFIX
        self.fd: int | None = None
        self.out_fd: int | None = None
        self.created = False

    def __enter__(self) -> OutputLock:
        import fcntl

        # Nothing of ours is written through a link someone placed beside the output.
        for p, what in (
            (self.target, "-o"),
            (self.path, "the lock file"),
            (str(manifest_path(self.target)), "the manifest"),
        ):
            refuse_symlink(p, what)
        try:
            self.created = not os.path.lexists(self.target)
            if self.create or not self.created:
                self.out_fd = open_nofollow(self.target, os.O_RDWR | (os.O_CREAT if self.create else 0), "-o")
        except OSError as e:
            raise OutputError(f"-o {self.target}: cannot open it for writing ({e.strerror})") from None
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
            raise OutputError(f"-o {self.target}: cannot write its lock file {self.path} ({e.strerror})") from None
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
            "wait for it to finish, or choose another -o"
        )

    def _note_holder(self) -> None:
        import fcntl

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
                if _same_file(os.fstat(fd), os.stat(self.path)):
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
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


# --------------------------------------------------------------------------- the manifest


def manifest_path(output: str) -> Path:
    return Path(output + MANIFEST_SUFFIX)


def write_manifest(
    output: str, settings: dict[str, Any], complete: bool, rows: int | None = None, fitted: dict | None = None
) -> None:
    """Write the manifest atomically (a torn manifest would make the output unresumable).

    A completed run also records the sha256 of the output's bytes (`output_sha256`):
    `merge` refuses a part whose rows were changed since."""
    from . import __version__

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
    import hashlib

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
        from .io import InputError

        raise InputError(f"cannot read the input {path} to record its content ({e.strerror})") from None
    return h.hexdigest(), None


class InputDigest:
    """`input_sha256` computed on a daemon thread while the model loads (one streaming pass
    over the file, overlapped with other work; a daemon, so Ctrl-C does not wait for it)."""

    def __init__(self, path: str | None):
        import threading

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
    import hashlib

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


# --------------------------------------------------------------------------- records and the writer


def result_record(row: Any, pred: Any | None, calibration: str = "none") -> dict[str, Any]:
    """The output object for one input row (a prediction, or an error row).

    A calibrated row says which calibration made `probs`, and keeps the model's own as
    `raw_probs`, so nothing is hidden."""
    if row.error is not None or pred is None or pred.error is not None:
        err = row.error if row.error is not None else (pred.error if pred is not None else "not processed")
        if not err.startswith("line "):
            err = f"line {row.line}: {err}"
        return {"id": row.id, "line": row.line, "error": err}
    if pred.answers is not None:
        rec: dict[str, Any] = {"id": row.id, "answers": answer_record(pred.answers)}
        if pred.truncated:
            rec["truncated"] = True
        return rec
    rec = {"id": row.id, "label": pred.label, "probs": written(pred.probs)}
    if pred.raw_probs is not None:
        rec["raw_probs"] = written(pred.raw_probs)
        rec["calibration"] = calibration
    if pred.abstained:
        rec["abstained"] = True
    if pred.truncated:
        rec["truncated"] = True
    return rec


def answer_record(answers: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Answers as written: probabilities (and expected levels) with `calibration.PROB_DIGITS` decimals."""
    out = {}
    for name, a in answers.items():
        a = dict(a)
        a["probs"] = written(a["probs"])
        if "raw_probs" in a:
            a["raw_probs"] = written(a["raw_probs"])
        for k in ("expected", "abstain"):
            if k in a:
                a[k] = round(a[k], PROB_DIGITS)
        out[name] = a
    return out


def flat_answers(answers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """An answers record as CSV/TSV/Parquet columns: `team`, `team.p_billing`, ..., a multi
    question's labels joined by ';', `q.expected` for a scale, `q.abstain` with a none option."""
    flat: dict[str, Any] = {}
    for name, a in answers.items():
        flat[name] = ";".join(a["labels"]) if "labels" in a else a["label"]
        for key, prefix in (("probs", "p_"), ("raw_probs", "raw_p_")):
            for lab, p in (a.get(key) or {}).items():
                flat[f"{name}.{prefix}{lab}"] = p
        if a.get("abstained"):
            flat[f"{name}.abstained"] = True
        for k in ("expected", "abstain"):
            if k in a:
                flat[f"{name}.{k}"] = a[k]
    return flat


def question_columns(questions: Sequence[Any], raw: bool = False, abstain: bool = False) -> list[str]:
    """CSV/TSV/Parquet header of a run that asks several questions (see `flat_answers`): with
    calibration each question's raw probabilities too, with a confidence threshold its flag."""
    cols = ["id"]
    for q in questions:
        cols.append(q.name)
        cols += [f"{q.name}.p_{lab}" for lab in q.labels]
        cols += [f"{q.name}.raw_p_{lab}" for lab in q.labels] if raw and q.kind != "head" else []
        cols += [f"{q.name}.abstained"] if abstain and q.kind != "multi" else []
        cols += [f"{q.name}.expected"] if q.kind == "scale" else []
        cols += [f"{q.name}.abstain"] if q.none else []
    return cols + ["truncated", "line", "error"]


def flat_record(rec: dict[str, Any]) -> dict[str, Any]:
    """An output record as one flat row (CSV/TSV/Parquet): `p_<label>` per label, or a question's columns."""
    flat = {k: v for k, v in rec.items() if k not in ("probs", "raw_probs", "answers")}
    for key, prefix in (("probs", "p_"), ("raw_probs", "raw_p_")):
        for lab, p in (rec.get(key) or {}).items():
            flat[prefix + lab] = p
    if rec.get("answers"):
        flat.update(flat_answers(rec["answers"]))
    return flat


def columns_of(settings: dict[str, Any]) -> list[str]:
    """The flat columns of a run, from its manifest's settings (labels, or questions as recorded)."""
    from types import SimpleNamespace

    raw = settings.get("calibration", "none") != "none"
    abstain = settings.get("min_confidence") is not None
    if settings.get("questions"):
        qs = [
            SimpleNamespace(
                name=r["name"],
                kind=r.get("kind", "choice"),
                none=r.get("none"),
                labels=r.get("labels") or r.get("levels") or r.get("answers") or ["yes", "no"],
            )
            for r in settings["questions"]
        ]
        return question_columns(qs, raw=raw, abstain=abstain)
    return csv_columns(settings["labels"], raw=raw, abstain=abstain)


def csv_columns(labels: Sequence[str], raw: bool = False, abstain: bool = False) -> list[str]:
    """CSV/TSV header: calibrated runs add the raw probabilities, abstaining runs a flag."""
    return [
        "id",
        "label",
        *(f"p_{lab}" for lab in labels),
        *(f"raw_p_{lab}" for lab in labels if raw),
        *(["calibration"] if raw else []),
        *(["abstained"] if abstain else []),
        "truncated",
        "line",
        "error",
    ]


class Writer:
    """JSONL, CSV or TSV, to a file or stdout; every record is flushed as it is written.

    Parquet (a file only) is columnar: its rows are kept and written as one table when the
    writer closes on a finished run (`close(complete=True)`), into a temporary file renamed
    into place, so a Parquet output appears only when complete. An older file at the path
    is removed when the writer opens (as the other formats truncate it), so an interrupted
    run (Ctrl-C, SIGKILL) leaves no Parquet file and no rows; Parquet outputs cannot be
    resumed."""

    def __init__(self, path: str | None, columns: Sequence[str], fmt: str = "jsonl", append: bool = False):
        self.fmt = fmt
        self.columns = list(columns)
        if fmt == "parquet":
            if path in (None, "-") or append:
                raise OutputError("Parquet is written to a file (-o FILE.parquet), whole, and cannot be appended to")
            self.parquet: ParquetRows | None = ParquetRows(self.columns)
            self.path = path
            require_pyarrow()
            refuse_symlink(path, "-o")
            try:  # the old output would outlive an interrupted run and pass for this one's
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                raise OutputError(f"-o {path}: cannot replace the file there ({e.strerror})") from None
            return
        self.parquet = None
        if path in (None, "-"):
            self.f: IO[str] = sys.stdout
            header = True
        else:
            flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
            try:
                if is_plain_file_target(path):  # a file: never through a link
                    fd = open_nofollow(path, flags, "-o")
                    header = not (append and os.fstat(fd).st_size > 0)
                    self.f = open(fd, "a" if append else "w", encoding="utf-8", newline="")
                else:  # a stream (/dev/null, a FIFO, a terminal), as stdout
                    header = True
                    self.f = open(path, "w", encoding="utf-8", newline="")
            except OSError as e:
                raise OutputError(f"-o {path}: cannot open it for writing ({e.strerror})") from None
        self.path = path
        if fmt != "jsonl":
            self.csv = csv.DictWriter(self.f, fieldnames=self.columns, delimiter=delimiter(fmt))
            if header:
                self.csv.writeheader()
                self.f.flush()

    def write(self, rec: dict[str, Any]) -> None:
        if self.parquet is not None:
            self.parquet.add(rec)
            return
        try:
            if self.fmt == "jsonl":
                self.f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            else:
                self.csv.writerow(flat_record(rec))
            self.f.flush()
        except BrokenPipeError:
            raise  # the reader went away (`| head`): the CLI ends quietly
        except OSError as e:  # a full disk, a vanished mount
            raise OutputError(
                f"cannot write to {self.path or 'stdout'} ({e.strerror}); what was written so far "
                "is complete row by row: free space and run again with --resume"
            ) from None

    def close(self, complete: bool = True) -> None:
        """Close the output. Parquet is written here, and only for a run that finished
        (`complete`): an interrupted one leaves no file."""
        if self.parquet is not None:
            rows, self.parquet = self.parquet, None
            if complete:
                from .safefs import atomic_writer

                with atomic_writer(self.path, "wb", "-o") as f:  # type: ignore[arg-type]
                    rows.write(f)
            return
        if self.f is not sys.stdout:
            self.f.close()


# --------------------------------------------------------------------------- Parquet


def require_pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        from .errors import MissingExtra

        raise MissingExtra(
            "Parquet output needs pyarrow: pip install 'mlx-slm[ray]' (or pyarrow), or write .jsonl/.csv"
        ) from None
    return pyarrow


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


class ParquetRows:
    """Output records gathered into typed columns, written as one Parquet table.

    Types: `id` int64 when every id is an integer that int64 holds (line numbers
    included), string when every id is a string; when a file holds both, or an integer
    beyond int64 (JSON integers have no bound), `id` is a string column and `id_is_int`
    (bool) says which were integers, so `1` and `"1"` stay apart and every id is exact. `p_*`/`raw_p_*` float64,
    `truncated`/`abstained` bool, `line` int64 (error rows), `label`, `calibration`,
    `error` string; a missing value is null."""

    def __init__(self, columns: Sequence[str]):
        self.columns = list(columns)
        self.data: dict[str, list[Any]] = {c: [] for c in self.columns}

    def add(self, rec: dict[str, Any]) -> None:
        flat = flat_record(rec)
        for c in self.columns:
            self.data[c].append(flat.get(c))

    def __len__(self) -> int:
        return len(self.data[self.columns[0]]) if self.columns else 0

    def table(self) -> Any:
        pa = require_pyarrow()
        arrays, names = [], []
        for c in self.columns:
            vals = self.data[c]
            if c == "id":
                ints = [isinstance(v, int) and not isinstance(v, bool) for v in vals]
                strs = [isinstance(v, str) for v in vals]
                # Not int64 (which would raise at the very end of a run): exact as text, flagged.
                wide = any(i and not INT64_MIN <= v <= INT64_MAX for v, i in zip(vals, ints))
                if not any(strs) and not wide:
                    arrays.append(pa.array(vals, pa.int64()))
                elif not any(ints):
                    arrays.append(pa.array(vals, pa.string()))
                else:
                    arrays.append(pa.array([None if v is None else str(v) for v in vals], pa.string()))
                    names.append("id")
                    arrays.append(pa.array([i if v is not None else None for v, i in zip(vals, ints)], pa.bool_()))
                    names.append("id_is_int")
                    continue
                names.append(c)
                continue
            # a question's columns: `name.p_<label>`, `name.expected`, ... (names hold no dot)
            if c.startswith(("p_", "raw_p_")) or re.match(r"[^.]+\.(p_|raw_p_|expected$|abstain$)", c):
                typ = pa.float64()
            elif c in ("truncated", "abstained") or re.fullmatch(r"[^.]+\.abstained", c):
                typ, vals = pa.bool_(), [bool(v) for v in vals]
            elif c == "line":
                typ = pa.int64()
            else:
                typ = pa.string()
            arrays.append(pa.array(vals, typ))
            names.append(c)
        return pa.Table.from_arrays(arrays, names=names)

    def write(self, f: Any) -> None:
        import pyarrow.parquet as pq

        pq.write_table(self.table(), f)


def parquet_records(table: Any) -> list[dict[str, Any]]:
    """A Parquet output's rows as output records (typed ids restored), for merge and checks."""
    cols = table.to_pydict()
    is_int = cols.pop("id_is_int", None)
    if is_int is not None:
        cols["id"] = [int(v) if flag else v for v, flag in zip(cols["id"], is_int)]
    n = table.num_rows
    return [{k: cols[k][i] for k in cols} for i in range(n)]


# --------------------------------------------------------------------------- reading an output back
#
# The one reader of the output format: resume (`scan_output`), merge (sharding.py) and
# `eval --predictions` (evaluate.py) all read rows through `read_records`.

_BOM = b"\xef\xbb\xbf"
_BAD_BYTE = re.compile("[\udc80-\udcff]")  # a byte that is not UTF-8, as surrogateescape keeps it


@dataclass(frozen=True)
class Record:
    """One row of an output file, as `read_records` finds it.

    `problem` says why the row is not an output record (None when it is), and `kind`
    which sort of problem: "utf8", "json", "object", "id" or "fields". The reader does not
    raise for it: each caller raises in its own words, when it chooses (merge checks a
    part's checksum first)."""

    row: int  # 1, 2, ... in file order; 0 is the CSV/TSV header
    line: int  # the file's line where the row starts (Parquet: the row)
    end: int  # byte offset just past the row, its line end included
    raw: bytes  # the row's exact bytes (b"" for Parquet)
    fields: dict[str, Any]  # JSONL: the object; CSV/TSV: column -> text; Parquet: typed values
    values: list[str] | None = None  # CSV/TSV: the fields in order (row 0: the column names)
    torn: bool = False  # the file's last row, cut short (no line end, or it ends inside quotes)
    problem: str | None = None
    kind: str | None = None


class RecordError(OutputError):
    """An output file that cannot be read on, row by row (broken CSV quoting, not Parquet)."""

    def __init__(self, path: str, row: int, line: int, why: str):
        self.path, self.row, self.line, self.why = path, row, line, why
        super().__init__(f"{path}: row {row} (line {line}) cannot be read ({why})")


def read_records(
    path: str, fmt: str, data: bytes | None = None, *, lenient: bool = False, strict_csv: bool = False
) -> Iterator[Record]:
    """The rows of an output file (`data`: its bytes, read from `path` if not given), in order.

    JSONL: one JSON object with an `id` per line; only `\\n` ends a line, so ids holding
    U+2028 or U+0085 read back as written. CSV/TSV: as Python's csv module writes them
    (a record may span lines inside quotes), a header first (row 0; a UTF-8 BOM before it
    is skipped), every row with the header's number of fields. Parquet: `parquet_records`.
    A torn last row is returned, marked `torn`. `lenient` (for files made by hand, as
    `eval --predictions` takes): blank lines are skipped, a JSONL object needs no id and a
    CSV row may have fewer fields than the header. `strict_csv`: the csv module's strict
    quoting. Raises `RecordError` where the file cannot be read on."""
    if data is None:
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise OutputError(f"cannot read back {path} ({e.strerror})") from None
    if fmt == "jsonl":
        return _jsonl_records(data, lenient)
    if fmt == "parquet":
        return _parquet_records(path, data)
    return _csv_records(path, data, delimiter(fmt), lenient, strict_csv)


def _jsonl_records(data: bytes, lenient: bool) -> Iterator[Record]:
    pos = line = row = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        end = len(data) if nl < 0 else nl + 1
        raw, body = data[pos:end], data[pos : end if nl < 0 else nl]
        pos, line = end, line + 1
        if lenient and not body.strip():
            continue
        row += 1
        fields: dict[str, Any] = {}
        problem = kind = None
        try:
            value = json.loads(body.decode("utf-8"))
        except UnicodeDecodeError as e:
            problem, kind = f"invalid UTF-8 (byte 0x{body[e.start]:02x})", "utf8"
        except RecursionError:
            problem, kind = "nested too deeply", "json"
        except ValueError as e:
            problem, kind = str(e), "json"
        else:
            if not isinstance(value, dict):
                problem, kind = f"a JSON {type(value).__name__}, not an object", "object"
            elif "id" not in value and not lenient:
                problem, kind = "an object without an id", "id"
            else:
                fields = value
        yield Record(row, line, end, raw, fields, torn=nl < 0, problem=problem, kind=kind)


def _csv_records(path: str, data: bytes, delim: str, lenient: bool, strict: bool) -> Iterator[Record]:
    bom = _BOM if data.startswith(_BOM) else b""
    try:
        text, clean = data[len(bom) :].decode("utf-8"), True
    except UnicodeDecodeError:  # kept byte for byte; the rows holding a bad byte say so
        text, clean = data[len(bom) :].decode("utf-8", "surrogateescape"), False
    f = io.StringIO(text, newline="")
    reader = csv.reader(f, delimiter=delim, strict=strict)
    header: list[str] | None = None
    pos, offset, line, row = 0, 0, 1, 0
    while True:
        try:
            values = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise RecordError(path, row + (header is not None), max(reader.line_num, 1), str(e)) from None
        chunk_end = f.tell()
        chunk = text[pos:chunk_end]
        raw = chunk.encode("utf-8", "surrogateescape")
        if header is None:
            raw = bom + raw
        start_line, end = line, offset + len(raw)
        pos, offset, line = chunk_end, end, line + chunk.count("\n")
        torn = chunk_end == len(text) and (not raw.endswith(b"\n") or raw.count(b'"') % 2 == 1)
        problem = kind = None
        if not clean and (bad := _BAD_BYTE.search(chunk)):
            problem, kind = f"invalid UTF-8 (byte 0x{ord(bad.group()) - 0xDC00:02x})", "utf8"
        if header is None:
            header = values
            yield Record(0, start_line, end, raw, {}, values, torn, problem, kind)
            continue
        if lenient and not values:
            continue  # a blank line
        row += 1
        if problem is None and (len(values) > len(header) or (len(values) < len(header) and not lenient)):
            problem, kind = f"{len(values)} fields where the header has {len(header)}", "fields"
        yield Record(row, start_line, end, raw, dict(zip(header, values)), values, torn, problem, kind)


def _parquet_records(path: str, data: bytes) -> Iterator[Record]:
    require_pyarrow()
    import pyarrow.parquet as pq

    try:
        recs = parquet_records(pq.read_table(io.BytesIO(data)))
    except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for a bad file
        raise RecordError(path, 1, 1, str(e)) from None
    for i, rec in enumerate(recs, 1):
        yield Record(i, i, len(data), b"", rec)


@dataclass(frozen=True)
class Written:
    """One complete output row as found in the file."""

    id: Any  # JSONL: as written (typed); CSV: the string ('' for none)
    error: bool
    end: int  # byte offset just past this row


def scan_output(path: str, fmt: str, columns: Sequence[str]) -> tuple[list[Written], int]:
    """The complete rows of an output file and the byte offset where its header ends.

    A torn last row (the run died mid-write) is not returned."""
    fix = "the file was changed by something else: start again without --resume"
    rows: list[Written] = []
    header_end = 0
    expected = list(columns)
    try:
        for rec in read_records(path, fmt):
            if rec.torn:
                break
            if rec.problem:
                raise OutputError(f"{path}: row {rec.row} is not an mlx-slm output record ({rec.problem}); {fix}")
            if rec.row == 0:
                if rec.values != expected:
                    raise OutputError(
                        f"{path}: its header {rec.values} is not {expected}: not an output of these settings"
                    )
                header_end = rec.end
                continue
            is_error = "error" in rec.fields if fmt == "jsonl" else bool(rec.fields.get("error"))
            rows.append(Written(rec.fields.get("id"), is_error, rec.end))
    except RecordError as e:
        raise OutputError(f"{path}: row {e.row} is not an mlx-slm output record ({e.why}); {fix}") from None
    return rows, header_end


def same_id(written: Any, input_id: Any, fmt: str) -> bool:
    if fmt in ("jsonl", "parquet"):
        return type(written) is type(input_id) and written == input_id
    return written == ("" if input_id is None else str(input_id))


def plan_resume(
    output: str, fmt: str, columns: Sequence[str], rows: Iterator[Any], window: int, complete_rows: int | None
) -> tuple[int, int, int, list[Any]]:
    """Check the written rows against the input's first rows and choose where to restart.

    `complete_rows` is the row count a completed run recorded (None if it did not
    complete). Returns (bytes to keep, rows kept, error rows kept, input rows to run
    again). Rows after the start of the last unfinished window are run again, so that
    each item is batched with the same neighbours as in an uninterrupted run.
    """
    written, header_end = scan_output(output, fmt, columns)
    complete = complete_rows is not None
    if complete and len(written) != complete_rows:
        raise OutputError(
            f"{output} holds {len(written)} complete rows, but the run that wrote it finished with {complete_rows}: "
            "it was changed since; start again without --resume"
        )
    keep, keep_end, valid = 0, header_end, 0
    redo: list[Any] = []
    for i, w in enumerate(written):
        row = next(rows, None)
        if row is None:
            raise OutputError(
                f"{output} holds {len(written)} rows but the input has only {i}: it is not the output of this input "
                "(start again without --resume)"
            )
        if not same_id(w.id, row.id, fmt):
            raise OutputError(
                f"{output}: row {i + 1} has id {w.id!r} where input line {row.line} has id {row.id!r}: "
                "it is not the output of this input (start again without --resume)"
            )
        if row.error is None:
            if valid % window == 0 and not complete:  # this row opens a window: a restart point
                keep, keep_end, redo = i, (written[i - 1].end if i else header_end), []
            valid += 1
        redo.append(row)
    if complete or valid % window == 0:  # the last window finished: keep everything
        keep, keep_end, redo = len(written), (written[-1].end if written else header_end), []
    kept_errors = sum(w.error for w in written[:keep])
    return keep_end, keep, kept_errors, redo


def truncate_to(path: str, size: int) -> None:
    fd = open_nofollow(path, os.O_WRONLY, "-o")
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
