"""The work behind each command, without click: the CLI parses options and calls one of these.

    plan.py      the options and a task file resolved once into a `classifier.Plan`, and what reads it
    classify.py  a file-to-file classify run (read, shard, resume, classify here or on Ray, write)
    rerank.py    queries and their documents in, each query's documents best first out
    train.py     a learned head from labelled texts
    finetune.py  `train --finetune lora`: a fine-tuned classifier from labelled texts
    choose.py    `train --finetune auto`: the head or a fine-tune, whichever wins on held-out texts
    evaluate.py  figures and plots against gold labels, and predictions read back
    decide.py    `decide`: a file of states to typed answers (read, shard, resume, a Decider here or on Ray, write)
    evaluate_decisions.py  `eval --decisions`: per-question figures and plots, `--fit` temperatures, the task

May import: ground, text, files, models, weights, engine, kinds, classifier, parity, ray.
"""
