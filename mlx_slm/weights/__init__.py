"""Weights: where a model comes from, how it is converted to MLX, and the weights fine-tuning makes.

    registry.py    built-in model names and the per-user cache (and its locks)
    sources.py     the one entry: a name, path, hub id or GGUF resolved, fetched, converted once
    convert.py     local files (a Hugging Face folder or a GGUF) to MLX safetensors
    modelfiles.py  a model folder checked before it is converted or loaded
    stfolder.py    where a sentence-transformers folder keeps its files (modules, backbone, fingerprint)
    adapters.py    `FineTuned`: LoRA adapters and a score head, saved, applied or merged
    finetune.py    `finetune`: training those adapters on tokenized prompts and gold labels
    export.py      a fine-tuned classifier out as a Transformers sequence classifier

May import: ground, text, models.
"""
