"""Suites that cross modules: the one place a test file need not mirror a module.

Every other test file is the home of one module's tests (`tests/<folder>/test_<module>.py` for
`mlx_slm/<folder>/<module>.py`, `tests/<folder>/test_init.py` for a package's own `__init__.py`;
`tools/test_layout.py` checks it). A file belongs here only when what it tests is the whole path
through several modules, so that no one module is its home:

    test_fuzz.py        Hypothesis over every reader and the service's request parser
"""
