"""The classifier: a scoring kind on an engine, with its calibration and batching; and the saved task.

    plan.py        `Plan`: one classification run resolved once (model, prompt, kind, calibration, batching,
                   how inputs are read), frozen; every front end makes one and everything after reads it
    pipeline.py    texts -> items -> batches -> `kind.score` -> predictions in input order
    classifier.py  `Classifier`: texts in, one prediction per text out
    embedder.py    `Embedder`: texts in, one vector per text out (a sentence-transformers folder's pooling)
    task.py        `Task`: the saved task file (model and weights hash, prompt, the kind's section)
    decider.py     `Decider`: typed decision requests in, each question's probabilities out (a batch of
                   requests at once: each state once, each question a branch; a cache of recent states)
    own_classifiers.py `OwnClassifiers`: the decision questions a classifier of their own answers (a
                   trained one beside the task, or the "prompt" style's), each its own pass over the state

May import: ground, text, files, models, weights, engine, kinds.
"""

from .classifier import Classifier, Run
from .embedder import Embedder
from .plan import Plan
from .task import Task

__all__ = ["Classifier", "Embedder", "Plan", "Run", "Task"]
