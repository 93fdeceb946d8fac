"""Files in and out: input readers, the output writers, the manifest and exact resume, shards.

    readers.py    JSONL, CSV/TSV, text and Parquet to one `Row` per record, errors as rows
    labelfiles.py --labels-file: a label a line (with its description), or JSONL objects
    output/       the writers, the output lock and manifest, `--resume`, the table of files a run reads
    sharding.py   `--shard I/N` (token-balanced cuts) and `merge`

No model: a reader gives rows, a writer takes the records `text.records` shapes.

May import: ground, text.
"""
