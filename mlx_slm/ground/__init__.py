"""The ground floor: what every other floor stands on, and nothing of mlx-slm's own above it.

    errors.py     `UserError` (the CLI prints it and exits 2; anything else is a bug) and its kinds
    notices.py    `notice`: the one printer of notes, a line on stderr, flushed
    safefs.py     every file we write: an exclusive temporary file, then a rename; links refused
    jsonfiles.py  a JSON record written atomically, the UTC time stamp records carry
    blas.py       an optimized CBLAS loaded before `mlx.core` (MLX's Linux wheel ships a slow one)
    textfiles.py  one text file a user named (UTF-8, a BOM dropped, the bad byte or path named)
    ranges.py     every numeric option's one range, asked by every front end
    version.py    the package's version

May import: nothing.
"""
