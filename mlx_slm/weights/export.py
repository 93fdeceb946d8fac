"""A fine-tuned classifier out as a Transformers checkpoint: `{Arch}ForSequenceClassification`.

    FineTuned + its base model -> the adapters merged into the weights (`FineTuned.merge`)
    -> every weight by its Hugging Face name, the LM head dropped, `score.weight` (K, D)
    added -> model.safetensors, config.json (the base's, with the architecture, `id2label`,
    `label2id`, `num_labels`, `problem_type`, `pad_token_id`, and the prompt under `mlx_slm`),
    the tokenizer's files and a model card (README.md)

`AutoModelForSequenceClassification.from_pretrained(DIR)` then reads the last non-padding
position's final-norm hidden state through `score`, as our `FineTuned.predict` does, so the
two give the same probabilities on the same prompt's tokens (tests/weights/test_finetune.py: float32,
1e-4). Objective "labels" exports when every label is one token: its score head is then the
LM head's rows of the labels' tokens (their logits are what label scoring softmaxes). Labels of
several tokens are scored at their own later positions, which no score head can hold: refused.

The folder is written in a private temporary folder beside `out` and renamed into place whole.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx

from ..ground.safefs import DIR_MODE, temp_dir
from ..models import Model, exportable
from .adapters import FineTuned, FinetuneError, dense_weights

DTYPES = ("float32", "float16", "bfloat16")


def score_weight(ft: FineTuned, model: Model) -> mx.array:
    """The (K, D) score head: the trained one, or (objective "labels", one-token labels) the LM head's label rows."""
    if ft.head is not None:
        return ft.head
    assert ft.label_tokens is not None
    long = [lab for lab, t in zip(ft.labels, ft.label_tokens) if len(t) > 1]
    if long:
        raise FinetuneError(
            f"objective 'labels' exports as a score head only when every label is one token; {long[:3]!r} are "
            "several (each later token is scored at its own position): fine-tune with `--objective score` "
            "(Python: objective='score') to export"
        )
    rows = mx.array([t[0] for t in ft.label_tokens], dtype=mx.int32)
    return mx.take(model.head_weight(), rows, axis=0)  # (K, D): what label scoring's label-row logits multiply


def config_for(
    ft: FineTuned,
    base: dict[str, Any],
    pad_token_id: int,
    dtype: str,
    prompt: dict[str, Any] | None,
    none: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The base's config.json made a sequence classifier's."""
    cfg = {k: v for k, v in base.items() if k not in ("quantization", "quantization_config", "torch_dtype")}
    cfg["architectures"] = [exportable()[base["model_type"]]]
    cfg["id2label"] = {str(i): lab for i, lab in enumerate(ft.labels)}
    cfg["label2id"] = {lab: i for i, lab in enumerate(ft.labels)}
    cfg["num_labels"] = len(ft.labels)
    cfg["problem_type"] = "single_label_classification"
    cfg["pad_token_id"] = int(pad_token_id)
    cfg["dtype"] = dtype
    cfg["mlx_slm"] = {
        "prompt": prompt if prompt is not None else ft.prompt,
        "objective": ft.objective,
        "lora": {
            "layers": list(ft.lora.layers),
            "keys": list(ft.lora.keys),
            "rank": ft.lora.rank,
            "scale": ft.lora.scale,
        },
        "base_sha256": ft.base.get("sha256"),
        "best_epoch": ft.best_epoch,
        "history": [e.__dict__ for e in ft.history],
    }
    if none is not None:  # "none of these": the label that means it, and the threshold the task answers with
        cfg["mlx_slm"]["none"] = dict(none)
    return cfg


def model_card(ft: FineTuned, cfg: dict[str, Any], base_name: str | None) -> str:
    prompt = cfg["mlx_slm"]["prompt"] or {}
    best = ft.history[ft.best_epoch - 1] if ft.best_epoch else None
    how = (
        "a score head (`score`, no bias) at the last position, trained with the adapters"
        if ft.objective == "score"
        else "the LM head's rows of the labels' tokens (objective `labels`: the labels' own tokens were trained)"
    )
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-classification",
        *([f"base_model: {base_name}"] if base_name else []),
        "tags: [mlx-slm, lora, text-classification]",
        "---",
        "",
        f"# {cfg['architectures'][0]}: {len(ft.labels)} labels",
        "",
        f"Fine-tuned with [mlx-slm](https://github.com/) from {base_name or 'its base model'}: LoRA adapters (rank "
        f"{ft.lora.rank}, scale {ft.lora.scale:g}) on blocks {ft.lora.layers[0]}-{ft.lora.layers[-1]} "
        f"({', '.join(ft.lora.keys)}), merged into the weights; the classifier is {how}.",
        "",
        "Labels: " + ", ".join(f"`{lab}`" for lab in ft.labels) + ".",
        "",
    ]
    if best is not None:
        lines += [
            f"Training: best epoch {ft.best_epoch} of {len(ft.history)} ({ft.stopped}); validation loss "
            f"{best.val_loss}, validation accuracy {best.val_accuracy}.",
            "",
        ]
    lines += [
        "The model reads the prompt it was trained with (recorded in `config.json` under `mlx_slm.prompt`): "
        "the chat template with that system message and the text in that template, ending with the "
        "generation prompt.",
        "",
        "```python",
        "from transformers import AutoModelForSequenceClassification, AutoTokenizer",
        "",
        "tok = AutoTokenizer.from_pretrained(DIR)",
        "model = AutoModelForSequenceClassification.from_pretrained(DIR)",
        'p = model.config.mlx_slm["prompt"]',
        'messages = ([{"role": "system", "content": p["system"]}] if p.get("system") else []) + [',
        '    {"role": "user", "content": p["template"].replace("{text}", text)}]',
        "ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors='pt', return_dict=True)",
        "probs = model(**ids).logits.softmax(-1)",
        "```",
        "",
    ]
    if prompt:
        lines += ["Prompt:", "", "```json", json.dumps(prompt, indent=2, ensure_ascii=False), "```", ""]
    none = cfg["mlx_slm"].get("none")
    if none:
        threshold = none.get("min_confidence")
        lines += [
            "None of these: the label `{}` means the text fits none of the others (out of scope). Answer no label "
            "when it is the likeliest{}.".format(
                none["label"] if none.get("label") else "(none)",
                f", or when no other label reaches {threshold:g}" if threshold is not None else "",
            ),
            "(`config.json`: `mlx_slm.none`; `mlx-slm classify --model DIR` answers it so, with `--min-confidence` "
            "for the threshold.)",
            "",
        ]
    return "\n".join(lines)


@dataclass(frozen=True)
class Described:
    """What an export writes beside the weights, in config.json's `mlx_slm` and the model card:
    `prompt`, the prompt to record (None: the one the adapters recorded); `none`, the task's
    "none of these" rule ({"label", "min_confidence"}); `base_name`, the base model's name."""

    prompt: dict[str, Any] | None = None
    none: dict[str, Any] | None = None
    base_name: str | None = None


def export(
    ft: FineTuned,
    model: Model,
    tokenizer: Any,
    source: str | Path,
    out: str | Path,
    *,
    described: Described = Described(),
    dtype: str = "float32",
    sha256: str | None = None,
) -> Path:
    """Write `ft` on `model` (the base it was trained on; `source`: its directory, whose
    config.json is the base config) as a Transformers sequence classifier in `out`, a new or
    empty folder. `described`: the prompt, rule and name recorded; `dtype`: of the written
    weights (float32 keeps the merged values exactly); `sha256`: the base weights' hash, checked
    against the adapters' record."""

    out = Path(out)
    if dtype not in DTYPES:
        raise FinetuneError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    mt = model.args.model_type
    if mt not in exportable():
        raise FinetuneError(
            f"export writes {', '.join(sorted(exportable()))} sequence classifiers; this model is {mt!r}"
        )
    if out.is_symlink() or (out.exists() and (not out.is_dir() or any(out.iterdir()))):
        raise FinetuneError(f"{out} exists and is not an empty folder: choose a new or empty folder for the export")
    try:
        base = json.loads((Path(source) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise FinetuneError(f"cannot read the base model's config.json in {source} ({e})") from None
    merged = ft.merge(model, sha256)
    weights = {k: v for k, v in dense_weights(merged).items() if not k.startswith("lm_head.")}
    weights["score.weight"] = score_weight(ft, model)
    weights = {k: v.astype(getattr(mx, dtype)) for k, v in weights.items()}
    bad = [k for k, v in weights.items() if mx.issubdtype(v.dtype, mx.floating) and not mx.all(mx.isfinite(v)).item()]
    if bad:  # a checkpoint of NaN or infinite weights answers NaN everywhere: never written
        raise FinetuneError(
            f"the merged weights hold non-finite values (NaN or infinity) in {', '.join(bad[:3])}"
            f"{' ...' if len(bad) > 3 else ''} as {dtype}: nothing is written; "
            + (
                "export as float32 or bfloat16 (--dtype), whose range holds them"
                if dtype == "float16"
                else "fine-tune again with lower learning rates (--lr, --head-lr)"
            )
        )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    cfg = config_for(ft, base, int(pad), dtype, described.prompt, described.none)
    tmp = temp_dir(out, "the export folder")
    try:
        mx.save_safetensors(str(tmp / "model.safetensors"), weights, {"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        tokenizer.save_pretrained(str(tmp))
        (tmp / "README.md").write_text(model_card(ft, cfg, described.base_name), encoding="utf-8")
        tmp.chmod(DIR_MODE)
        if out.exists():
            out.rmdir()  # empty (checked above)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
