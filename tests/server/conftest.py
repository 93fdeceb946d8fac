"""The server tests' shared fixture: the tiny classifier served over real HTTP on 127.0.0.1."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def srv(tiny_qwen_mlx):
    """A `ThreadServer` serving the tiny model's classifier (max_wait 5 ms), for the module's tests;
    a test module that serves something else defines its own `srv`."""
    from mlx_slm.server import ServeOptions, Service, classifier_loader
    from tests.server.test_app import ThreadServer

    s = ThreadServer(Service(classifier_loader(str(tiny_qwen_mlx)), ServeOptions(max_wait_ms=5))).start()
    yield s
    s.stop()
