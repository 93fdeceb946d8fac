"""Typed decisions (System One's `/v1/systemone`, OpenAI's `/v1/decisions`): what a request is,
how each question is asked, how its answer is shaped and made right. Pure: no model.

A decision request is a *state* (a text, a JSON object or a list) and several questions about
it, each of a type: ``noul`` (OpenAI: ``predicate``; yes or no, answered as P(true)),
``choice`` (one of 2..255 options) or ``score`` (one of 2..10 ordered levels, answered as the
expected level). Every question is asked as Transformers' generic decision prompt by default
(the state, then the question, as the ONE user message of the model's chat template) and read
at the last position on the option labels' logits; the state comes first, so every question of
a request shares the state's tokens.

One home per rule; import each name from its module (there is no facade here):

    errors.py        `DecisionError` (FastAPI's `loc`, a `type`), `DecisionErrors`
    questions.py     `DecisionQuestion` (its `digest`: the question itself), `DecisionRequest`, the bounds
    settings.py      a model's `DecisionConfig` (decision.json), read and written once
    checks.py        what both APIs check of a state, an instruction, a name, a count
    systemone.py     System One's request read and checked
    openai.py        OpenAI's request read and checked (unknown parameters refused)
    files.py         a questions file (either API's questions, or a whole body)
    prompt.py        the prompt's text: DECISION_PROMPT ("letters"), the "names" style, or "prompt"'s system message
    prompt_tokens.py the prompt's token ids as Transformers encodes them; the labels read
    confidence.py    TypeSafe's confidence formulas
    answers.py       each API's answer shape, per question type
    methods.py       how a question is answered beyond the raw letters: style, order averaging,
                     a prior, a fitted bias and temperature, a trained head (bound by digest)
    metrics.py       a question's accuracy, Brier, log-loss, ECE; a fitted temperature
"""
