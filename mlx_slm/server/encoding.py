"""Request bodies sent with a `Content-Encoding`: zstd (what typesafe-sdk sends by default for
bodies of 1 KiB and more), gzip (and x-gzip) and deflate, decoded with a cap on the decoded size.

The cap is the server's body limit (`--max-body-bytes`): a body is judged by what it decodes
to, so a small compressed body that would decode to gigabytes (a "zstd bomb") is refused with
413 after reading at most the limit plus one byte of its output, never inflated whole. A body
that is not what its header says is a 400 naming the encoding; an encoding we do not read is a
415 naming the ones we do. zstd is read with the standard library's `compression.zstd`
(Python 3.14), else `backports.zstd`, else `zstandard` (the `serve` extra installs it)."""

from __future__ import annotations

import io
import zlib
from collections.abc import Callable

from .errors import HTTPError

# What every 413 over the body limit says, as sent (`checks.read_body`) or decoded (`decode_body`).
BODY_FIX = "send less, or raise --max-body-bytes"

ENCODINGS = ("zstd", "gzip", "x-gzip", "deflate", "identity")


def _zstd() -> Callable[[bytes, int], bytes] | None:
    """A zstd decoder `(data, most) -> at most `most` bytes of output`, or None without one."""
    for mod in ("compression.zstd", "backports.zstd"):
        try:
            z = __import__(mod, fromlist=["ZstdDecompressor"])
        except ImportError:
            continue

        def dec(data: bytes, most: int, z=z) -> bytes:  # type: ignore[no-untyped-def]
            # One decompressor per frame: a body may hold several frames, one after another.
            out, rest = bytearray(), data
            while rest and len(out) < most:
                d = z.ZstdDecompressor()
                out += d.decompress(rest, max_length=most - len(out))
                if not d.eof:
                    if d.needs_input and len(out) < most:
                        raise ValueError("the zstd data ends before its frame does")
                    break  # `most` reached
                rest = d.unused_data
            return bytes(out)

        return dec
    try:
        import zstandard  # lazy: optional, the last of three zstd decoders tried (none: zstd bodies refused)
    except ImportError:
        return None

    def dec2(data: bytes, most: int) -> bytes:
        reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
        out = bytearray()
        while len(out) < most:
            chunk = reader.read(min(1 << 20, most - len(out)))
            if not chunk:
                break
            out += chunk
        return bytes(out)

    return dec2


def _zlib(wbits: int) -> Callable[[bytes, int], bytes]:
    def dec(data: bytes, most: int) -> bytes:
        d = zlib.decompressobj(wbits)
        out = d.decompress(data, most)
        if len(out) < most and not d.eof:
            raise ValueError("the compressed data ends before its stream does")
        return out

    return dec


def decode_body(raw: bytes, content_encoding: str | None, limit: int) -> bytes:
    """The body as sent before its `Content-Encoding` (several codings: undone last to first);
    413 when it decodes to more than `limit` bytes, 400 when it is not valid for its encoding,
    415 for an encoding this server does not read."""
    codings = [c.strip().lower() for c in (content_encoding or "").split(",") if c.strip()]
    for coding in reversed(codings):
        if coding == "identity":
            continue
        if coding == "zstd":
            dec = _zstd()
            if dec is None:
                raise HTTPError(
                    415,
                    "this server cannot read zstd bodies (no zstd decoder installed: pip install zstandard); "
                    "send the body uncompressed (typesafe-sdk: compression=False) or gzip'd",
                    "content-encoding",
                    outcome="invalid",
                )
        elif coding in ("gzip", "x-gzip"):
            dec = _zlib(16 + zlib.MAX_WBITS)
        elif coding == "deflate":
            dec = _zlib(zlib.MAX_WBITS)
        else:
            raise HTTPError(
                415,
                f"Content-Encoding {coding!r} is not supported: send the body as zstd, gzip, deflate or uncompressed",
                "content-encoding",
                outcome="invalid",
            )
        try:
            raw = dec(raw, limit + 1)
        except (ValueError, zlib.error, EOFError, MemoryError) as e:
            raise HTTPError(
                400,
                f"the body is not valid {coding} data ({str(e)[:120] or type(e).__name__}): send what Content-Encoding says",
                "content-encoding",
                outcome="invalid",
            ) from None
        except Exception as e:  # noqa: BLE001 - a decoder's own error type (zstandard.ZstdError, ZstdError)
            if "zstd" not in type(e).__name__.lower():
                raise
            raise HTTPError(
                400,
                f"the body is not valid zstd data ({str(e)[:120]}): send what Content-Encoding says",
                "content-encoding",
                outcome="invalid",
            ) from None
        if len(raw) > limit:
            raise HTTPError(
                413,
                f"the body decodes ({coding}) to more than the limit of {limit} bytes: {BODY_FIX}",
                "body",
            )
    return raw
