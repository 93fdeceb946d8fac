"""The pure pieces: texts, prompts, labels, questions, batch plans, calibration and metrics, no model.

Everything here is plain data and rules the floors above share, testable without MLX weights:

    predictions.py  `Prediction`, `Stats`, the tokenized `Item`
    prompts.py      chat-template rendering, batched tokenization, the shared token prefix
    labels.py       label token ids, first-token or whole-label scoring, the label trie, label checks
    questions.py    a `Question` (choice, yes/no, scale, multi, head) and how its answer is read
    branches.py     several questions per text laid out as branches of one tree
    answers.py      calibration and abstain per question
    batching.py     sort, token budget, left padding
    records.py      `RecordShape`: a prediction as every output shows it
    inputs.py       what the Python API takes as texts; progress bars
    heads.py        a learned linear head on hidden states (numpy)
    seqcls.py       a `*ForSequenceClassification` checkpoint's head, as its config says
    metrics.py      accuracy, P/R/F1, confusion, calibration error, coverage
    workload.py     the benchmark's 600 tickets
    chat.py         an OpenAI chat-completions request read: messages, choices, a JSON-schema enum
    decisions/      typed decisions (System One, OpenAI): requests read and checked, the prompt
                    and its tokens, each API's answer, the methods that make answers right, metrics
    calibration/    the `Calibrator`, its fitters, `CalibrationSpec` and the per-run `Calibration`

May import: ground.
"""
