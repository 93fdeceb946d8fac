"""The classifier: a scoring kind on an engine, with its calibration and batching; and the saved task.

    pipeline.py    texts -> items -> batches -> `kind.score` -> predictions in input order
    classifier.py  `Classifier`: texts in, one prediction per text out
    embedder.py    `Embedder`: texts in, one vector per text out (a sentence-transformers folder's pooling)
    task.py        `Task`: the saved task file (model and weights hash, prompt, the kind's section)
    decider.py     `Decider`: typed decision requests in, each question's probabilities out (a batch of
                   requests at once: each state once, each question a branch; a cache of recent states)

May import: ground, text, models, weights, engine, kinds.
"""

from .classifier import Classifier, Run
from .embedder import Embedder
from .task import Task

__all__ = ["Classifier", "Embedder", "Run", "Task"]
