"""The project's error types. Each message is one line: the bad input, what was expected, the fix."""

import contextlib
from typing import Iterator


class CkptSearchError(Exception):
    """Base of every error this project raises on bad input.

    The message is folded onto one line, so a multi-line cause quoted in it (a user factory's
    exception, a pydantic report) still reads as one line in a log or a terminal.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class WorkloadError(CkptSearchError):
    """A workload spec, factory or loss that cannot be used."""


class PlanError(CkptSearchError):
    """A plan that does not fit the model, names missing units, or asks for an unusable action."""


class UnitError(CkptSearchError):
    """Decision units that cannot be found or overlap."""


class MeasurementError(CkptSearchError):
    """A measurement that failed (out of memory, a unit that ran twice, ...)."""


class ModelError(CkptSearchError):
    """The user's model (its forward, loss or backward) raised during a training step: the model's own
    exception and where the search met it (choosing units, warm-up, the profile, a plan's measurement)."""

    @classmethod
    def during(cls, where: str, error: BaseException) -> "ModelError":
        return cls(f"the model raised {type(error).__name__}: {error} (during {where}); fix the model or its "
                   "factory: a plain training step of it fails the same way")


class BudgetError(CkptSearchError):
    """A memory budget that cannot be read, or that no measured plan fits."""


@contextlib.contextmanager
def model_errors(where: str) -> Iterator[None]:
    """The model's own exception, raised while running ``where``, as one ``ModelError`` line that names both (the
    search's driver shows it once, without Ray's frames); the project's own errors pass as they are."""
    try:
        yield
    except CkptSearchError:
        raise
    except Exception as e:
        raise ModelError.during(where, e) from e
