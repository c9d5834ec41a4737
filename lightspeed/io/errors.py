"""The one error type every loader raises for a file it cannot use."""
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
