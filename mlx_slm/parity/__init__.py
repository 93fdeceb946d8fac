"""The proof: PyTorch/Transformers in float32, one item at a time, and every parity report against it.

    reference.py  the slow, obvious path (run in a child process: no BLAS shared with MLX)
    labels.py     `parity --model`: our labels and logits against Transformers', and conversion drift
    seqcls.py     a sequence classifier's and a reranker's answers against the pipeline's
    finetune.py   a fine-tuned task against Transformers with its adapters merged
    chat.py       the chat route's choices and next-token log-probabilities against classify and Transformers
    embeddings.py an embedding folder's vectors against sentence-transformers' encode
    decisions.py  `parity --decisions`: typed decisions against `transformers.decision`'s own path

May import: ground, text, models, weights, engine, kinds, classifier.
"""
