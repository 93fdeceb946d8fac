"""Request bodies with a Content-Encoding (server/encoding.py): zstd (several frames too), gzip and
deflate decoded; a body that decodes past the limit (a zstd bomb) a 413 after reading at most the
limit; a body that is not what its header says a 400; an unknown encoding a 415."""

from __future__ import annotations

import gzip
import zlib

import pytest

from mlx_slm.server.encoding import decode_body
from mlx_slm.server.errors import HTTPError

zstd = pytest.importorskip("zstandard")

BODY = b'{"model": "jev-latest", "state": "x", "questions": {}}' * 40


@pytest.mark.parametrize(
    "enc, data",
    [
        ("zstd", zstd.ZstdCompressor().compress(BODY)),
        ("gzip", gzip.compress(BODY)),
        ("x-gzip", gzip.compress(BODY)),
        ("deflate", zlib.compress(BODY)),
        ("identity", BODY),
        (None, BODY),
        ("ZSTD", zstd.ZstdCompressor().compress(BODY)),
    ],
)
def test_each_encoding_decodes(enc, data):
    assert decode_body(data, enc, 1 << 20) == BODY


def test_zstd_of_several_frames_and_stacked_codings():
    two = zstd.ZstdCompressor().compress(BODY[:100]) + zstd.ZstdCompressor().compress(BODY[100:])
    assert decode_body(two, "zstd", 1 << 20) == BODY
    stacked = zstd.ZstdCompressor().compress(gzip.compress(BODY))  # gzip first, then zstd
    assert decode_body(stacked, "gzip, zstd", 1 << 20) == BODY


@pytest.mark.parametrize("enc", ["zstd", "gzip"])
def test_a_bomb_is_413_without_inflating_it(enc):
    big = b"0" * (64 << 20)  # 64 MiB of zeros: a few KiB compressed
    data = zstd.ZstdCompressor().compress(big) if enc == "zstd" else gzip.compress(big)
    assert len(data) < 1 << 20
    with pytest.raises(HTTPError) as e:
        decode_body(data, enc, 1 << 20)
    assert e.value.status == 413 and "decodes" in e.value.message and "--max-body-bytes" in e.value.message


def test_bad_data_is_400_and_unknown_encoding_415():
    for enc in ("zstd", "gzip", "deflate"):
        with pytest.raises(HTTPError) as e:
            decode_body(b"not compressed at all", enc, 1 << 20)
        assert e.value.status == 400 and enc in e.value.message and e.value.field == "content-encoding"
    truncated = zstd.ZstdCompressor().compress(BODY)[:-8]
    with pytest.raises(HTTPError) as e:
        decode_body(truncated, "zstd", 1 << 20)
    assert e.value.status == 400
    with pytest.raises(HTTPError) as e:
        decode_body(BODY, "br", 1 << 20)
    assert e.value.status == 415 and "'br'" in e.value.message
