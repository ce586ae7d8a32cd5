"""The token classification parts of the data step, for tasks/steps/data.py to wire in: the
split of a train file given alone into train and eval sentences.

It lives among the steps because it is the data step's own split rule (`Splitter`), which
tasks/io may not import.
"""
from __future__ import annotations

from typing import Callable

from tasks.io.token_readers import Sentence
from tasks.steps.data import Splitter


def eval_chooser(num_sentences: int, eval_fraction: float,
                 seed: int) -> Callable[[list[str], list[str]], bool]:
    """`to_eval(tokens, tags)`, called once per sentence in file order: the data step's
    streaming split rule (tasks.steps.data.Splitter: exactly min(n-1, max(1,
    round(n * eval_fraction))) sentences held out, chosen by a seeded hash of each sentence),
    with all sentences as one class, since a sentence has no single label."""
    splitter = Splitter({"": num_sentences}, eval_fraction, seed)
    return lambda tokens, tags: splitter.to_eval(" ".join(tokens), " ".join(tags), "")


def split_sentences(sentences: list[Sentence], eval_fraction: float,
                    seed: int) -> tuple[list[Sentence], list[Sentence]]:
    """(train, eval) of `sentences` by `eval_chooser`'s rule, each in input order."""
    to_eval = eval_chooser(len(sentences), eval_fraction, seed)
    train, evals = [], []
    for sentence in sentences:
        (evals if to_eval(sentence[1], sentence[2]) else train).append(sentence)
    return train, evals
