"""The work behind each command, without click: the CLI parses options and calls one of these.

    plan.py      the options and a task file resolved once into a `classifier.Plan`, and what reads it
    filerun.py   the one file run every file-to-file job plugs into (manifest, resume, shards, the writer loop)
    classify.py  a file-to-file classify run (read, shard, resume, classify here or on Ray, write)
    rerank.py    queries and their documents in, each query's documents best first out (on the file run)
    embed.py     `embed`: every text's vector (JSONL on the file run; Parquet and .npy written whole)
    labelled.py  the one reader of labelled texts (a file of texts and gold labels) for training
    train.py     a learned head from labelled texts (`TrainRun`: what every way of training reads)
    finetune.py  `train --finetune lora`: a fine-tuned classifier from labelled texts
    choose.py    `train --finetune auto`: the head or a fine-tune, whichever wins on held-out texts
    out_of_scope.py  "none of these" (`NoneRule`), a threshold chosen on held-out data
    evaluate.py  figures and plots against gold labels, and predictions read back
    decide.py    `decide`: a file of states to typed answers (read, shard, resume, a Decider here or on Ray, write)
    evaluate_decisions.py  `eval --decisions`: per-question figures and plots, `--fit` temperatures, the task

May import: ground, text, files, models, weights, engine, kinds, classifier, parity, ray.
"""
