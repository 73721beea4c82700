"""The Runner interface every backend implements (after Polygraphy's runners)."""
from __future__ import annotations

import abc
from collections.abc import Mapping
from types import TracebackType

import numpy as np
import onnx

from quantdbg.data import check_feed
from quantdbg.errors import BackendError
from quantdbg.model.specs import TensorSpec


class Runner(abc.ABC):
    """Runs one model. ``activate`` builds the session/engine; ``infer`` runs a checked feed.

    Usable as a context manager::

        with OnnxrtRunner(model) as runner:
            outputs = runner.infer({"input": x})
    """

    name: str = "runner"

    def __init__(self) -> None:
        self.is_active = False

    def __enter__(self) -> Runner:
        self.activate()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.deactivate()

    def activate(self) -> None:
        """Builds whatever the backend needs (session, engine); idempotent."""
        if not self.is_active:
            self._activate()
            self.is_active = True

    def deactivate(self) -> None:
        """Frees backend resources; idempotent."""
        if self.is_active:
            self._deactivate()
            self.is_active = False

    def infer(self, feed: Mapping[str, np.ndarray],
              outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        """Checks ``feed`` against the model's inputs, runs it, and returns outputs by name.

        Args:
            feed: Input name -> array.
            outputs: Output names to fetch (None: every graph output).

        Returns:
            Output name -> array.

        Raises:
            BackendError: The runner is not active or the backend failed.
            DataError: The feed does not match the model's inputs.
        """
        if not self.is_active:
            raise BackendError(f"{self.name}: call activate() (or use `with`) before infer().")
        return self._infer(check_feed(feed, self.input_specs()), outputs)

    @abc.abstractmethod
    def input_specs(self) -> dict[str, TensorSpec]:
        """The model's inputs."""

    @abc.abstractmethod
    def _activate(self) -> None: ...

    @abc.abstractmethod
    def _deactivate(self) -> None: ...

    @abc.abstractmethod
    def _infer(self, feed: dict[str, np.ndarray], outputs: list[str] | None) -> dict[str, np.ndarray]: ...


class RunnerFactory(abc.ABC):
    """Makes a runner for a model; what sensitivity analysis and fallback search are given."""

    @abc.abstractmethod
    def __call__(self, model: onnx.ModelProto) -> Runner: ...
