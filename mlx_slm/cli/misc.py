"""`convert`, `doctor`, `models` and `bench`: the model cache and the machine."""

from __future__ import annotations

import json
import platform
import runpy
import sys
from pathlib import Path

import click
import mlx.core as mx

from ..classifier.embedder import EmbeddingError, read_pooling
from ..ground import blas as _blas
from ..ground.errors import UserError
from ..kinds import reranker_spec
from ..models import default_compute_dtype
from ..models.base import backbone_architecture, prefix_backbone
from ..text.labels import LabelError
from ..text.seqcls import SeqClsHead
from ..weights.convert import check_out_dir, check_quantize, is_converted
from ..weights.convert import convert as do_convert
from ..weights.modelfiles import tensor_names
from ..weights.registry import BUILTINS, cache_dir
from ..weights.sources import Source, cached_path, describe, fetch, materialise, resolve
from .base import Command, notice


@click.command(cls=Command, sections={"dtype": "Conversion"})
@click.argument("src")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--dtype", type=click.Choice(["float16", "bfloat16", "float32"]), default="float16", show_default=True)
@click.option(
    "--quantize",
    type=int,
    metavar="4|8",
    help="Write an MLX-quantized directory (mlx-lm's format) with this many bits per weight.",
)
@click.option(
    "--group-size",
    type=int,
    metavar="32|64|128",
    help="Weights sharing one scale and bias, with --quantize (default 64).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace --out even if it is a non-empty folder that is not a previous conversion (never the source).",
)
def convert(src: str, out: str, dtype: str, quantize: int | None, group_size: int | None, force: bool) -> None:
    """Convert SRC (Hugging Face dir, hub id, .gguf, or a built-in name) to MLX safetensors.

    --out must be new, an empty folder or a previous conversion (replaced); another
    folder is left untouched unless --force. It may never be, hold or lie in SRC.

    \b
    With --quantize 4|8 the Linear and Embedding weights are packed as mlx-lm packs them
    (norms and biases stay in --dtype), so mlx_lm.load reads the directory too:
      mlx-slm convert Qwen/Qwen2.5-0.5B-Instruct --out qwen-4bit --quantize 4 --group-size 64

    Docs: docs/models.md
    """

    check_quantize(quantize, group_size)  # before any download
    check_out_dir(src, Path(out), force)  # before any download too; checked again against the local source
    source = resolve(src)  # what SRC is (no network)
    got = fetch(source)  # a built-in name or hub id fetched here: convert reads local files only
    path = do_convert(
        got.path, out, dtype=dtype, quantize=quantize, group_size=group_size, force=force, origin=got.origin
    )
    what = dtype if quantize is None else f"{quantize}-bit, group size {group_size or 64}, {dtype}"
    notice(f"mlx-slm: converted {src} -> {path} ({what})")
    click.echo(str(path))


@click.command(cls=Command)
@click.option(
    "--model",
    default=None,
    help="Also say which head this model has (an LM head, or a sequence classifier's score head) and "
    "whether it reranks (fetched and converted into the cache first, as classify would).",
)
def doctor(model: str | None) -> None:
    """Show the MLX device, compute dtype, BLAS in use and its measured matmul rate (and, with
    --model, which head the model has).

    Docs: docs/parity.md
    """
    peak = _blas.matmul_peak()
    g_mlx, g_np = peak["mlx"], peak["numpy"]
    click.echo(f"platform       {platform.platform()} ({platform.machine()})")
    click.echo(f"mlx            {mx.__version__}, device {mx.default_device()}")
    click.echo(f"compute dtype  {str(default_compute_dtype()).replace('mlx.core.', '')}")
    if sys.platform == "linux":
        click.echo(f"BLAS           {_blas.LOADED or 'MLX bundled reference BLAS (slow)'}")
    click.echo(
        f"matmul f32     MLX {g_mlx:.1f} GFLOP/s, numpy {g_np:.1f} GFLOP/s ({100 * g_mlx / g_np:.0f} % of numpy)"
    )

    click.echo(f"model cache    {cache_dir()}")
    click.echo(f"model sources  {describe()}")
    if sys.platform == "linux" and g_mlx < 0.5 * g_np:
        notice(f"mlx-slm: warning: MLX's matmul is far below numpy's. Fix: {_blas.FIX}")
    if model is not None:
        for key, line in model_head_lines(model):
            click.echo(f"{key:14s} {line}")


def model_head_lines(model: str) -> list[tuple[str, str]]:
    """What `doctor --model` says of a model: where it is, its head, and what reranks with it
    (as `serve`'s rerank routes and `--reranker auto` choose)."""
    path = materialise(model)
    config = json.loads((path / "config.json").read_text())
    own = SeqClsHead.from_config(config)
    if own is None:
        head = f"{(config.get('architectures') or ['a causal LM'])[0]}: the LM head (labels scored by their tokens)"
    else:
        labels = ", ".join(own.labels[:8]) + (", ..." if own.num_labels > 8 else "")
        head = (
            f"{own.architecture}: a score head of {own.num_labels} label(s) ({labels}), {own.function}"
            f" (problem_type {own.problem_type or 'unset'})"
        )
    # A bare backbone: config.json names one, or the weights lack the `model.` prefix (Qwen3-Embedding's layout)
    backbone = own is None and (backbone_architecture(config) or prefix_backbone(dict.fromkeys(tensor_names(path)))[1])
    if backbone:
        head = (
            f"{(config.get('architectures') or ['?'])[0]}: none (a bare backbone: it embeds, it does not score labels)"
        )
    try:
        spec = reranker_spec(None, own, model)
        rerank = f"{spec.scorer} (what --reranker auto and serve's rerank routes use)"  # type: ignore[attr-defined]
    except LabelError as e:
        rerank = f"no: {e}"
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    try:
        pooling = read_pooling(path, int(text.get("hidden_size") or 0), own is None and not backbone, "a model")
        embeds = f"{pooling.describe()} (what mlx-slm embed and serve's embedding routes use)"
    except EmbeddingError as e:
        embeds = f"no: {e}"
    return [("model", f"{model} -> {path}"), ("head", head), ("reranker", rerank), ("embeddings", embeds)]


@click.command(cls=Command)
def models() -> None:
    """List the built-in model names (fetched from PyPI on first use).

    Docs: docs/models.md
    """

    for name, m in BUILTINS.items():
        ready = is_converted(cached_path(Source(name, "builtin"), "float16"))
        click.echo(f"{name:22s} {'cached ' if ready else 'not yet'}  {m.description}")


@click.command(
    cls=Command, context_settings={"ignore_unknown_options": True, "allow_extra_args": True}, add_help_option=False
)
@click.pass_context
def bench(ctx: click.Context) -> None:
    """Time every mode against Transformers on the workload (a checkout's benchmarks/; `mlx-slm bench --help`).

    Docs: docs/benchmarks.md
    """
    runner = Path(__file__).resolve().parents[2] / "benchmarks" / "run.py"
    if not runner.is_file():
        raise UserError(
            "the benchmark harness lives in the repository's benchmarks/ folder, not in the installed "
            "package: run `python benchmarks/run.py` from a checkout"
        )
    sys.argv = [str(runner), *ctx.args]
    runpy.run_path(str(runner), run_name="__main__")
