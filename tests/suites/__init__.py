"""Suites that cross modules: the one place a test file need not mirror a module.

Every other test file is the home of one module's tests: `tests/<folder>/test_<module>.py` for
`mlx_slm/<folder>/<module>.py`, `tests/<folder>/test_init.py` for a package's own `__init__.py`, and
the same for `tools/` and `benchmarks/` under `tests/tools/` and `tests/benchmarks/`
(`tools/test_layout.py` checks it; tests/tools/test_test_layout.py runs it). A file belongs here only
when what it tests is a whole path through several modules, so that no one module is its home:

    test_fuzz.py          Hypothesis over every reader and the service's request parser
    test_fuzz_jobs.py     Hypothesis over what round seven found in the jobs, the CLI, training, task files
    test_docs.py          the manual holds together: links, anchors, the commands' Docs: lines, its Python blocks
    test_real_smollm2.py  real weights (SmolLM2-135M) against Transformers, end to end
    test_gpu.py           MLX's GPU against the CPU, end to end (skipped where there is none)
    test_jevstyle.py      a third-party client (jev-style's eval) against `mlx-slm serve --task`

Exempt from a test file (a docstring and imports, no function or class of its own; the checker
refuses an exemption of a module that grows one):
    mlx_slm/cli/__main__.py
    mlx_slm/classifier/__init__.py
    mlx_slm/engine/__init__.py
    mlx_slm/files/__init__.py
    mlx_slm/files/output/__init__.py
    mlx_slm/ground/__init__.py
    mlx_slm/parity/__init__.py
    mlx_slm/server/__init__.py
    mlx_slm/service/__init__.py
    mlx_slm/sklearn/__init__.py
    mlx_slm/text/__init__.py
    mlx_slm/text/calibration/__init__.py
    mlx_slm/text/decisions/__init__.py
    mlx_slm/weights/__init__.py
"""
