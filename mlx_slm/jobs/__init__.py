"""The work behind each command, without click: the CLI parses options and calls one of these.

    setup.py     one task set-up for every command that loads a model (options + a task file)
    classify.py  a file-to-file classify run (read, shard, resume, classify here or on Ray, write)
    rerank.py    queries and their documents in, each query's documents best first out
    train.py     a learned head from labelled texts
    finetune.py  `train --finetune lora`: a fine-tuned classifier from labelled texts
    choose.py    `train --finetune auto`: the head or a fine-tune, whichever wins on held-out texts
    evaluate.py  figures and plots against gold labels, and predictions read back

May import: ground, text, files, models, weights, engine, kinds, classifier, parity, ray.
"""
