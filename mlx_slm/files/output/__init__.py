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

The package, one module per concern, each importing only the ones before it: `paths` (the
output's format, never over an input), `runfiles` (the table of the files a run reads, none an
output), `manifest` (the lock and the manifest), `writers` (`Writer`, `ParquetRows`), `reader`
(`read_records`), `resume` (`plan_resume`). A record's shape and its columns are `text.records`'
(one records module); they, too, are importable from here. Every name is importable from
`mlx_slm.files.output`.
"""

# jobs/classify.py takes OutputError from here, as it could before the split.
from ...ground.errors import OutputError
from ...text.records import (
    answer_record,
    columns_of,
    csv_columns,
    flat_answers,
    flat_record,
    question_columns,
    result_record,
)
from .manifest import (
    LOCK_SUFFIX,
    MANIFEST_SUFFIX,
    MANIFEST_VERSION,
    NOT_HASHED_STDIN,
    NOT_HASHED_STREAM,
    InputDigest,
    OutputLock,
    changed_settings,
    input_changed,
    input_sha256,
    manifest_path,
    output_sha256,
    read_manifest,
    write_manifest,
)
from .paths import (
    _EXTENSIONS,
    OUTPUT_FORMATS,
    check_new_folder,
    check_outputs,
    check_writable,
    delimiter,
    is_plain_file_target,
    output_format,
    refuse_input_as_output,
)
from .reader import Record, RecordError, read_records
from .resume import Written, plan_group_resume, plan_resume, same_id, scan_output, truncate_to
from .runfiles import ADAPTERS_SUFFIX, READS, adapters_file, check_run_files, files_read
from .writers import INT64_MAX, INT64_MIN, ParquetRows, Writer, id_columns, parquet_records, require_pyarrow

__all__ = [
    "OutputError",
    "ADAPTERS_SUFFIX",
    "READS",
    "adapters_file",
    "check_run_files",
    "files_read",
    "OUTPUT_FORMATS",
    "delimiter",
    "_EXTENSIONS",
    "output_format",
    "is_plain_file_target",
    "check_new_folder",
    "check_outputs",
    "check_writable",
    "refuse_input_as_output",
    "MANIFEST_SUFFIX",
    "LOCK_SUFFIX",
    "MANIFEST_VERSION",
    "OutputLock",
    "manifest_path",
    "write_manifest",
    "NOT_HASHED_STDIN",
    "NOT_HASHED_STREAM",
    "input_sha256",
    "InputDigest",
    "input_changed",
    "output_sha256",
    "read_manifest",
    "changed_settings",
    "result_record",
    "answer_record",
    "flat_answers",
    "question_columns",
    "flat_record",
    "columns_of",
    "csv_columns",
    "Writer",
    "require_pyarrow",
    "id_columns",
    "INT64_MIN",
    "INT64_MAX",
    "ParquetRows",
    "parquet_records",
    "Record",
    "RecordError",
    "read_records",
    "Written",
    "scan_output",
    "same_id",
    "plan_resume",
    "plan_group_resume",
    "truncate_to",
]
