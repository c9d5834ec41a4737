"""The error types the loaders and the chat-template renderer raise."""
from __future__ import annotations

import os


class ModelFormatError(ValueError):
    """A model file (or folder) is malformed, truncated or inconsistent.

    ``path`` is the offending file and ``problem`` says what is wrong with it; the
    message reads ``"<path>: <problem>"``.
    """

    def __init__(self, path: "str | os.PathLike[str]", problem: str):
        self.path = os.fspath(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")

    def __reduce__(self):  # keep the two fields when pickled (e.g. across processes)
        return (type(self), (self.path, self.problem))


class ChatTemplateError(ValueError):
    """The template is invalid, or raised an error (``raise_exception``) for these messages."""


class ChatTemplateLimitError(ChatTemplateError):
    """The template ran past a bound of ``TemplateLimits`` (time, loop iterations, output size, call
    depth) and was stopped."""
