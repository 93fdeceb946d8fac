"""An embed job: every text of an input file to its vector, in input order, as `mlx-slm embed` runs it
(`classifier.Embedder` does the work).

INPUT is read as classify reads it (JSONL, CSV/TSV, text lines, Parquet: `readers.read_rows`); the
output's format is its extension: JSONL (`{"id", "embedding": [...]}` per row, an error row
`{"id", "line", "error"}` as classify writes one; stdout when there is no -o), Parquet (columns
id, embedding (a list of float32), line, error) or `.npy` (one (N, D) float32 array in input
order, a row of NaN for each error, the errors on stderr). Parquet's ids are typed as classify's
(`files.output.id_columns`: `1` and "1" stay apart).

JSONL is written row by row on the file run (`jobs.filerun`): with -o FILE the output is locked
and its manifest records what decides the vectors, so `--resume` continues an interrupted output
of the same input and settings and `--shard I/N` writes a part `mlx-slm merge` joins, both equal
to an uninterrupted run byte for byte. The texts go to the model in windows of `--window` input
rows (error rows counted, as embed always cut them): a resumed run starts again at the last
unfinished window. Parquet and `.npy` are written whole when the run ends (no resume, no shards).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from ..classifier.embedder import Embedder
from ..engine.engine import Engine
from ..files.output import OutputLock, check_run_files, files_read, id_columns, is_plain_file_target, require_pyarrow
from ..files.readers import ReadSpec, read_rows
from ..ground.errors import UsageError
from ..ground.safefs import atomic_writer
from ..text.predictions import Stats
from ..weights.registry import ModelRef
from .filerun import Distribution, FileRun, Say, Where, windows

OUTPUTS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".npy": "npy"}


def output_kind(output: str | None) -> str:
    """jsonl, parquet or npy, by -o's extension (stdout: JSONL)."""
    if output in (None, "-"):
        return "jsonl"
    ext = Path(output).suffix.lower()
    if ext not in OUTPUTS:
        raise UsageError(f"-o {output}: unknown extension {ext or '(none)'!r}; use .jsonl, .parquet or .npy")
    return OUTPUTS[ext]


@dataclass
class EmbedSettings:
    """One embed run: the input, the output, the prompt and the vectors' size, the file run's
    options, and the task options as typed (`o`: model, fields, batching, dtype, quiet)."""

    input: str = "-"
    output: str | None = None
    prompt_name: str | None = None
    prompt: str | None = None
    dimensions: int | None = None
    normalize: bool | None = None
    truncate: bool = False
    resume: bool = False
    shard: str | None = None  # "I/N"
    o: dict[str, Any] = field(default_factory=dict)

    def read(self) -> ReadSpec:
        o = self.o
        return ReadSpec(o.get("fmt"), o.get("text_field"), o.get("id_field"), o.get("text_column"), o.get("id_column"))


def embed(s: EmbedSettings, say: Say) -> int:
    """Check the settings, lock a JSONL output and run; the number of error rows in the whole output."""
    kind = output_kind(s.output)
    check_run_files(files_read(s.o, ("INPUT", s.input)), [("-o", s.output)])
    if s.prompt is not None and s.prompt_name is not None:
        raise UsageError("give --prompt-name or --prompt, not both")
    file_out = is_plain_file_target(s.output)
    if kind != "jsonl" and (s.resume or s.shard):
        raise UsageError(
            f"{'--resume' if s.resume else '--shard'} needs a JSONL output: .npy and Parquet are written whole "
            "when the run ends, so an interrupted run leaves nothing to continue from and a part nothing to join; "
            "write .jsonl"
        )
    if s.resume and not file_out:
        raise UsageError("--resume needs -o FILE, a regular file (the output to continue)")
    if s.resume and s.input == "-":
        raise UsageError("--resume needs an input file: standard input cannot be read again to check it")
    dist = Distribution(s.shard)
    dist.check(s.input, file_out)
    job = EmbedJob(s, say)
    if kind != "jsonl":
        return job.whole(kind)
    with ExitStack() as stack:
        if file_out:
            stack.enter_context(OutputLock(s.output))  # type: ignore[arg-type]
        where = Where(s.input, s.output if file_out else None, s.output, "jsonl", s.resume)
        return job.run(where, dist)


class EmbedJob:
    """An embed run: on the file run (JSONL, `run`), or written whole (Parquet, .npy: `whole`)."""

    command = "embed"
    changed_input = (
        ", so its rows are of the old content; start again without --resume (the whole input is embedded "
        "again into {out})"
    )
    loose = ("model",)  # the same weights by another name or path
    all_rows = True  # a window is `window` input rows, error rows too
    group = None

    def __init__(self, s: EmbedSettings, say: Say):
        self.s, self.say, self.o = s, say, s.o
        self.window = self.o.get("window") or 1024
        self.stats = Stats()
        self.file: FileRun | None = None

    def load(self) -> None:
        """The model and the prompt, the size and the normalizing its vectors get (refused by name first)."""
        o, s = self.o, self.s
        self.ref = ModelRef(o["model"], o.get("dtype"), o.get("keep_quantized"))
        engine = Engine.load(self.ref)
        self.emb = Embedder(
            engine,
            truncate=s.truncate,
            batch_size=o.get("batch_size"),
            max_batch_tokens=o.get("max_batch_tokens") or "auto",
            sort=not o.get("no_sort"),
            use_prefix_cache=not o.get("no_prefix_cache"),
        )
        self.text = self.emb.pooling.prompt_text(s.prompt_name, s.prompt, "--prompt-name")
        self.dims = self.emb.check_dimensions(s.dimensions)
        self.norm = (self.emb.pooling.normalize or self.dims is not None) if s.normalize is None else s.normalize

    def run(self, where: Where, dist: Distribution) -> int:
        self.file = f = FileRun(self, where, self.window, dist, self.say, bool(self.o.get("quiet")))
        done = f.run()
        if not self.o.get("quiet"):
            if f.kept and done == 0:
                self.say(
                    f"mlx-slm: {where.output} was complete already: {f.kept} rows ({f.kept_failed} errors) kept, "
                    "nothing left to embed"
                )
            else:
                kept = f"; {f.kept} rows kept from the interrupted run ({f.kept_failed} errors)" if f.kept else ""
                self._summary(done, f.failed - f.kept_failed, kept)
        return f.failed

    def whole(self, kind: str) -> int:
        """Parquet or .npy: every row embedded, then the file written at once."""
        self.load()
        rows = list(read_rows(self.s.input, self.s.read()))
        got = list(self._embedded(iter(rows)))
        vectors = (
            np.stack([v for _, v, _ in got]) if got else np.zeros((0, self.dims or self.emb.dimension), np.float32)
        )
        errors = [e for _, _, e in got]
        write(kind, self.s.output, rows, vectors, errors, self.say)
        failed = sum(1 for e in errors if e)
        if not self.o.get("quiet"):
            self._summary(len(rows), failed, "")
        return failed

    def _summary(self, done: int, failed: int, kept: str) -> None:
        st, norm, dims = self.stats, self.norm, self.dims
        self.say(
            f"mlx-slm: {done} texts ({failed} errors) in {st.seconds:.1f} s, {done / max(st.seconds, 1e-9):.2f} "
            f"texts/s; {st.processed_tokens:,} tokens processed, padding {st.padding_pct:.1f} %, the prompt's head saved "
            f"{st.prefix_saved_tokens:,} tokens; {self.emb.pooling.describe()}"
            + (f"; normalized{f', first {dims} values' if dims else ''}" if norm else "")
            + kept
        )

    # ------------------------------------------------------------------ the pieces a FileRun takes
    def rows(self) -> Iterator[Any]:
        """The input's rows, the first read now (its format and header settled before the model loads)."""
        rows = iter(read_rows(self.s.input, self.s.read()))
        first = next(rows, None)
        return itertools.chain([first] if first is not None else [], rows)

    def sizes(self, rows: list[Any]) -> list[int | None]:
        """Each row's tokens; an error row weighs nothing but is counted in its window (0, not None)."""
        valid = [i for i, r in enumerate(rows) if r.error is None]
        counts: list[int | None] = [0] * len(rows)
        tok = self.emb.engine.tokenizer
        for k in range(0, len(valid), 4096):
            chunk = valid[k : k + 4096]
            for i, x in zip(chunk, tok([rows[i].text for i in chunk], add_special_tokens=False)["input_ids"]):
                counts[i] = len(x)
        return counts

    def columns(self) -> list[str]:
        return ["id", "embedding", "line", "error"]

    def settings(self) -> dict[str, Any]:
        """What the output's manifest records: --resume and merge accept only the same."""
        assert self.file is not None
        emb, read = self.emb, self.s.read()
        return {
            "weights_sha256": emb.engine.weights_sha256,
            "form": "embeddings",
            "pooling": emb.pooling.describe(),
            "prompt": self.text,
            "normalize": bool(self.norm),
            "dimensions": self.dims,
            "truncate": emb.truncate,
            "dtype": emb.engine.compute_dtype,
            **self.file.input_record(),
            "input_format": read.fmt,
            "fields": [read.text_field, read.id_field, read.text_column, read.id_column],
            "output_format": "jsonl",
            "batch_size": emb.batching.batch_size,
            "max_batch_tokens": emb.batching.max_batch_tokens,
            "window": self.window,
            "sort": emb.batching.sort,
            "prefix_cache": emb.use_prefix_cache,
            "model": self.ref.name,
        }

    def restore(self, previous: dict[str, Any], kept: int) -> None:
        """Nothing: a vector depends on its window alone."""

    def records(self, rows: Iterator[Any]) -> Iterator[dict[str, Any]]:
        for r, v, e in self._embedded(rows):
            yield {"id": r.id, "line": r.line, "error": _error(r, e)} if e else {"id": r.id, "embedding": v.tolist()}

    def _embedded(self, rows: Iterator[Any]) -> Iterator[tuple[Any, np.ndarray, str | None]]:
        """Each row, its vector (NaN for an error) and its error, a window of `window` input rows at a time."""
        for window in windows(rows, self.window, all_rows=True):
            texts = [r.text if r.error is None else None for r in window]
            got = self.emb.embed(texts, prompt=self.text, normalize=self.norm, dimensions=self.dims, window=len(texts))
            for f in fields(Stats):
                setattr(self.stats, f.name, getattr(self.stats, f.name) + getattr(got.stats, f.name))
            for r, v, e in zip(window, got.vectors, got.errors):
                yield r, v, (r.error if r.error is not None else e)


def _error(row: Any, err: str) -> str:
    return err if err.startswith("line ") else f"line {row.line}: {err}"


def write(kind: str, output: str | None, rows: list[Any], vectors: np.ndarray, errors: list[Any], say: Say) -> None:
    """The rows in `kind`'s format, Parquet or .npy, to `output` (atomically)."""
    if kind == "npy":
        with atomic_writer(output, "wb", "-o") as f:  # type: ignore[arg-type]
            np.save(f, vectors)
        for r, e in zip(rows, errors):
            if e:
                say(f"mlx-slm: row {r.id!r}: {_error(r, e)}")
        return
    pa = require_pyarrow()
    import pyarrow.parquet as pq  # lazy: pyarrow is optional (the ray extra) and slow to import

    columns = id_columns([r.id for r in rows])  # typed as classify's: `1` and "1" stay apart (`id_is_int`)
    columns += [
        ("embedding", pa.array([None if e else v for v, e in zip(vectors, errors)], pa.list_(pa.float32()))),
        ("line", pa.array([r.line for r in rows], pa.int64())),
        ("error", pa.array([_error(r, e) if e else None for r, e in zip(rows, errors)], pa.string())),
    ]
    table = pa.Table.from_arrays([a for _, a in columns], names=[n for n, _ in columns])
    with atomic_writer(output, "wb", "-o") as f:  # type: ignore[arg-type]
        pq.write_table(table, f)


__all__ = ["EmbedSettings", "OUTPUTS", "embed", "output_kind"]
