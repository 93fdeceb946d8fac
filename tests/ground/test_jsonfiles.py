"""The record writers' helpers (`ground/jsonfiles.py`): a JSON document replaced whole through a
rename (readers see the old or the new), never written through a link, and the time it carries."""

from __future__ import annotations

import datetime as dt
import json
import os

import pytest

from mlx_slm.ground.errors import UserError
from mlx_slm.ground.jsonfiles import utc_now, write_json_atomic


def test_a_document_is_replaced_whole_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "manifest.json"
    write_json_atomic(path, {"complete": False, "rows": [1, 2]})
    write_json_atomic(path, {"complete": True})
    assert json.loads(path.read_text()) == {"complete": True}
    assert os.listdir(tmp_path) == ["manifest.json"]


def test_a_link_in_the_documents_place_is_refused_and_its_target_kept(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text("keep me")
    link = tmp_path / "task.json"
    link.symlink_to(target)
    with pytest.raises(UserError):
        write_json_atomic(link, {"labels": ["a"]})
    assert target.read_text() == "keep me"


def test_utc_now_is_an_iso_time_in_utc_to_the_second():
    t = dt.datetime.fromisoformat(utc_now())
    assert t.utcoffset() == dt.timedelta(0) and t.microsecond == 0
    assert abs((dt.datetime.now(dt.timezone.utc) - t).total_seconds()) < 60
