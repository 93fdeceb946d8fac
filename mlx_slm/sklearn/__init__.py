"""`SLMClassifier`: mlx-slm as a scikit-learn classifier, for notebooks and model selection.

    est = SLMClassifier(model="qwen2.5-coder-0.5b").fit(texts, y)   # a learned head
    est.predict(new_texts); est.predict_proba(new_texts)            # columns in classes_ order
    cross_val_score(est, texts, y, cv=5); joblib.dump(est, "est.joblib")

It is a thin shell over the library: `fit` runs `jobs.train.train_head` (method "head", the
same cross-validated choice of parts and estimator as `mlx-slm train`), fine-tunes LoRA
adapters and a score head (method "finetune", `jobs.finetune.finetune_texts`, as `mlx-slm train
--finetune lora`) or builds a zero-shot label-scoring `Classifier` (method "labels", with
`Classifier.fit_calibration` when calibration is "fit" or "em"), and keeps the result as a
`task.Task`: the same task file the CLI, the service and Ray take (`to_task`, `from_task`).
Predictions come from `Classifier.classify` on that task.

Why the weights live outside the estimator: scikit-learn clones an estimator for every
fold and every grid candidate, and pickles it to save it. The loaded model (hundreds of
MB) is held once per process in a cache keyed by the model and its weights' sha256
(`shared_engine`), shared by every clone; a pickle holds the task (labels, prompt, head,
calibration, the model's name and its weights' sha256), and the first prediction after
loading finds the model by that name or path and refuses other weights, naming both
hashes. A fine-tuned estimator's pickle holds its adapters too (the safetensors bytes
`FineTuned.save` writes: a few MB, against the model's hundreds), so it needs no file
beside it; `to_task` writes them beside the task file, as `train --finetune` does.

The package: `engines.py` (one engine per process, the feature cache), `data.py` (X and y
checked), `methods.py` (the ways to fit, one object each), `estimator.py` (`SLMClassifier`).

May import: ground, text, models, weights, engine, kinds, classifier, jobs.
"""

try:
    import sklearn  # noqa: F401  (the extra; the modules below import from it)
except ImportError as e:  # pragma: no cover - the extra is missing
    from ..ground.errors import MissingExtra

    raise MissingExtra("mlx_slm.sklearn needs scikit-learn: pip install 'mlx-slm[sklearn]'") from e

from .engines import FEATURE_CACHE_BYTES, FEATURES, FeatureCache, clear_engines, shared_engine
from .estimator import SLMClassifier
from .methods import DEFAULT_SYSTEM, DEFAULT_TEMPLATE, METHOD_OF_KIND, METHODS, TUNING, in_memory

SLMClassifier.__module__ = __name__  # pickles name it where the docs do: mlx_slm.sklearn.SLMClassifier

__all__ = [
    "DEFAULT_SYSTEM",
    "DEFAULT_TEMPLATE",
    "FEATURES",
    "FEATURE_CACHE_BYTES",
    "METHODS",
    "METHOD_OF_KIND",
    "TUNING",
    "FeatureCache",
    "SLMClassifier",
    "clear_engines",
    "in_memory",
    "shared_engine",
]
