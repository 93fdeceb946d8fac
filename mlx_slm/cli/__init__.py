"""The `mlx-slm` command: classify, eval, train, convert, parity, bench, doctor, models.

Results go to stdout (JSONL by default) or to `-o FILE`; progress, warnings and the
summary go to stderr, so the output can be piped. User errors (`errors.UserError`) print
one clear line and exit with status 2; Ctrl-C exits 130; a reader that goes away
(`| head`) ends the run quietly (141); any other exception is a bug, shows its traceback
and exits 70.

May import: ground, text, files, models, weights, engine, kinds, classifier, parity, jobs, ray, service, server, sklearn.
"""

from __future__ import annotations

import errno
import os
import sys
import traceback
from typing import Any

import click

from ..ground.errors import UserError
from .base import notice
from .classify import classify, merge
from .decide import decide
from .embed import embed
from .eval import evaluate
from .export import export
from .misc import bench, convert, doctor, models
from .parity import parity
from .rerank import rerank
from .serve import serve
from .train import train

BUG_REPORT = "mlx-slm: this is a bug in mlx-slm, not in your input: please report it with the traceback above"


class _UserError(click.ClickException):
    exit_code = 2

    def show(self, file: Any = None) -> None:
        notice(f"mlx-slm: error: {self.format_message()}")


class _Commands(click.Group):
    """User errors (`UserError`) become one readable line and exit 2; Ctrl-C exits 130;
    anything else is a bug, and its traceback shows, with a line that says so."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as e:
            raise _UserError(str(e)) from e
        except KeyboardInterrupt:
            notice("mlx-slm: interrupted")
            sys.exit(130)
        except BrokenPipeError:
            _silence_stdout()  # stdout's reader left: nothing more can be delivered; silence the final flush
            sys.exit(141)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except OSError as e:
            if e.errno not in DISK_FULL:
                _bug()
            # A report or a listing to a full disk (stdout > a full file system): the environment, not
            # a bug; stdout is pointed at /dev/null so that Python's flush at exit cannot raise again.
            _silence_stdout()
            raise _UserError(
                f"cannot write ({e.strerror or e}): free space on the disk written to, and run again"
            ) from None
        except Exception:
            _bug()


DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _silence_stdout() -> None:
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _bug() -> None:
    """Any other exception: a bug in mlx-slm, its traceback shown (exit 70)."""
    traceback.print_exc()
    notice(BUG_REPORT)
    sys.exit(70)  # EX_SOFTWARE


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mlx-slm")
def main() -> None:
    """Fast, verified text classification with small language models on MLX.

    \b
    Quick start (the built-in default model is fetched and converted on first use):
      echo "My card was charged twice" | mlx-slm classify
      mlx-slm classify tickets.jsonl --labels billing,technical,account -o out.jsonl
      mlx-slm train labelled.jsonl --save-task task.json && mlx-slm classify tickets.jsonl --task task.json
      mlx-slm decide tickets.jsonl --questions Q.json -o answers.jsonl
      mlx-slm rerank --query "card charged twice" docs.jsonl --model RERANKER --top-n 5
      mlx-slm embed tickets.jsonl --model EMBEDDER -o vectors.npy
      mlx-slm parity --model smollm2-135m --reference smollm2-135m --n 10
      mlx-slm doctor

    Docs: docs/index.md
    """


for _command in (
    classify,
    merge,
    decide,
    evaluate,
    rerank,
    embed,
    convert,
    train,
    export,
    parity,
    doctor,
    models,
    bench,
    serve,
):
    main.add_command(_command)

__all__ = ["BUG_REPORT", "main"]
