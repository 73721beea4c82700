"""Running a strongly typed TensorRT engine: :class:`TrtRunner`, its device buffers, and latency.

:class:`TrtRunner` needs the ``tensorrt`` Python bindings (10.x or 11.x), an NVIDIA GPU and
``cuda-python``; both come with the ``quantdbg[tensorrt]`` extra. Nothing is imported at module
import: ``import quantdbg.backends.tensorrt`` works without them, and the first use raises
:class:`~quantdbg.errors.MissingDependencyError` naming the extra. :class:`LatencyResult` is plain
Python.
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import onnx

from quantdbg._io import write_bytes_atomic
from quantdbg._json import Serializable
from quantdbg.backends.base import Runner
from quantdbg.backends.tensorrt.bindings import cuda_check, cudart, load_tensorrt, trt
from quantdbg.backends.tensorrt.build import TrtLogger, build_engine
from quantdbg.backends.tensorrt.config import TrtConfig
from quantdbg.backends.tensorrt.inspector import LayerPrecision, parse_engine_info
from quantdbg.data import check_feed
from quantdbg.errors import BackendError, ConfigError, DataError, unknown
from quantdbg.model import load_model
from quantdbg.model.load import ModelSource
from quantdbg.model.specs import TensorSpec, input_specs


@dataclass(frozen=True)
class LatencyResult(Serializable):
    """GPU time of ``execute_async_v3`` per iteration, measured with CUDA events.

    Host-device copies are excluded: the inputs are copied once before timing.

    Attributes:
        times_ms: One time per timed iteration, in milliseconds.
        input_shapes: Input name -> shape the engine ran with.
    """

    times_ms: tuple[float, ...]
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.times_ms:
            raise ConfigError("LatencyResult needs at least one timed iteration.")
        object.__setattr__(self, "times_ms", tuple(float(t) for t in self.times_ms))
        object.__setattr__(self, "input_shapes",
                           MappingProxyType({k: tuple(v) for k, v in self.input_shapes.items()}))

    @property
    def mean_ms(self) -> float:
        """Mean time."""
        return statistics.fmean(self.times_ms)

    @property
    def median_ms(self) -> float:
        """Median time."""
        return statistics.median(self.times_ms)

    @property
    def p90_ms(self) -> float:
        """90th percentile (nearest rank)."""
        ordered = sorted(self.times_ms)
        return ordered[max(0, -(-9 * len(ordered) // 10) - 1)]

    def __json_extra__(self) -> dict[str, float]:
        """The summary statistics, written for readers of the JSON (recomputed when read back)."""
        return {"mean_ms": self.mean_ms, "median_ms": self.median_ms, "p90_ms": self.p90_ms,
                "min_ms": min(self.times_ms), "max_ms": max(self.times_ms)}


class _DeviceBuffer:
    """One device allocation that grows on demand (never shrinks, so shapes can change cheaply)."""

    def __init__(self) -> None:
        self.ptr = 0
        self.nbytes = 0

    def reserve(self, nbytes: int) -> int:
        if nbytes > self.nbytes or not self.ptr:
            self.free()
            self.ptr = int(cuda_check(cudart().cudaMalloc(max(nbytes, 1)), "cudaMalloc"))
            self.nbytes = nbytes
        return self.ptr

    def free(self) -> None:
        if self.ptr:
            cuda_check(cudart().cudaFree(self.ptr), "cudaFree")
        self.ptr, self.nbytes = 0, 0


class _Session:
    """Everything an active runner owns; :meth:`close` releases it in reverse order of creation."""

    def __init__(self, runtime: trt.Runtime, engine: trt.ICudaEngine, context: trt.IExecutionContext,
                 logger: TrtLogger, stream: Any) -> None:
        self.runtime = runtime
        self.engine = engine
        self.context = context
        self.logger = logger
        self.stream = stream
        self.buffers: dict[str, _DeviceBuffer] = {}
        # Host arrays of in-flight asynchronous copies, kept alive until the stream is synchronized.
        self.in_flight: dict[str, np.ndarray] = {}

    def buffer(self, name: str) -> _DeviceBuffer:
        """The device buffer of I/O tensor ``name`` (created empty on first use)."""
        return self.buffers.setdefault(name, _DeviceBuffer())

    def close(self) -> None:
        # TensorRT wants the context destroyed before its engine, and the engine before its runtime;
        # the session is discarded after this, so deleting the references frees them in that order.
        del self.context
        del self.engine
        del self.runtime
        for buffer in self.buffers.values():
            buffer.free()
        self.in_flight.clear()
        cuda_check(cudart().cudaStreamDestroy(self.stream), "cudaStreamDestroy")


def _dims(dims: trt.Dims) -> tuple[int, ...]:
    return tuple(int(dims[i]) for i in range(len(dims)))


def _numpy_dtype(engine: trt.ICudaEngine, name: str) -> np.dtype[Any]:
    # Spelled out rather than trt.nptype() so that a type NumPy lacks (BF16, FP8, INT4) gets a clear error.
    trt_type = engine.get_tensor_dtype(name)
    known = {trt.DataType.FLOAT: np.float32, trt.DataType.HALF: np.float16, trt.DataType.INT8: np.int8,
             trt.DataType.INT32: np.int32, trt.DataType.INT64: np.int64, trt.DataType.BOOL: np.bool_,
             trt.DataType.UINT8: np.uint8}
    if trt_type not in known:
        raise BackendError(f"Engine tensor {name!r} has TensorRT type {trt_type}, which has no NumPy "
                           "equivalent; keep network inputs and outputs in FP32/FP16/INT8/INT32/INT64/BOOL.")
    return np.dtype(known[trt_type])


class TrtRunner(Runner):
    """Runs a Q/DQ ONNX model with TensorRT (strongly typed, explicit quantization).

    Example::

        with TrtRunner("model_qdq.onnx", TrtConfig(batch=(1, 8, 32))) as runner:
            outputs = runner.infer({"x": x})
            layers = runner.layer_precisions()
            latency = runner.measure_latency({"x": x})

    Args:
        model: The Q/DQ ONNX model (path or ModelProto; never modified).
        config: How to build or load the engine (None: ``TrtConfig()``).
    """

    name = "tensorrt"

    def __init__(self, model: ModelSource, config: TrtConfig | None = None) -> None:
        super().__init__()
        self.model = model
        self.config = TrtConfig() if config is None else config
        self._proto: onnx.ModelProto | None = None
        self._session: _Session | None = None

    def _model(self) -> onnx.ModelProto:
        if self._proto is None:
            self._proto = load_model(self.model, allow_quantized=True)
        return self._proto

    def input_specs(self) -> dict[str, TensorSpec]:
        """The model's inputs, which feeds are checked against."""
        return input_specs(self._model())

    def _activate(self) -> None:
        load_tensorrt()
        rt = cudart()
        if self.config.load_engine is not None:
            if not self.config.load_engine.is_file():
                raise BackendError(f"Engine file {str(self.config.load_engine)!r} does not exist.")
            plan = self.config.load_engine.read_bytes()
        else:
            plan = build_engine(self._model(), self.config)
            if self.config.save_engine is not None:
                write_bytes_atomic(self.config.save_engine, plan)
        logger = TrtLogger()
        runtime = trt.Runtime(logger.trt_logger)
        engine = runtime.deserialize_cuda_engine(plan)
        if engine is None:
            raise BackendError(f"TensorRT could not deserialize the engine: {logger.last_errors()}. An "
                               "engine only loads with the TensorRT version and GPU that built it.")
        context = engine.create_execution_context()
        if context is None:
            raise BackendError(f"TensorRT could not create an execution context: {logger.last_errors()}.")
        stream = cuda_check(rt.cudaStreamCreate(), "cudaStreamCreate")
        self._session = _Session(runtime, engine, context, logger, stream)

    def _deactivate(self) -> None:
        if self._session is not None:
            self._session.close()
        self._session = None

    def _active(self) -> _Session:
        if self._session is None:
            raise BackendError("tensorrt: call activate() (or use `with`) first.")
        return self._session

    def _tensor_names(self, mode: trt.TensorIOMode) -> list[str]:
        engine = self._active().engine
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        return [name for name in names if engine.get_tensor_mode(name) == mode]

    def _prepare(self, feed: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
        """Sets input shapes, copies inputs to the device and binds every I/O address.

        Returns:
            Output name -> shape for these inputs.
        """
        session, rt = self._active(), cudart()
        kind = rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        for name in self._tensor_names(trt.TensorIOMode.INPUT):
            host = np.ascontiguousarray(feed[name], dtype=_numpy_dtype(session.engine, name))
            if not session.context.set_input_shape(name, tuple(host.shape)):
                profile = [_dims(d) for d in session.engine.get_tensor_profile_shape(name, 0)]
                raise BackendError(
                    f"Input {name!r} has shape {host.shape}, outside the engine's optimization profile "
                    f"{profile} (min, opt, max). Rebuild with a TrtConfig whose batch/shapes cover it.")
            ptr = session.buffer(name).reserve(host.nbytes)
            cuda_check(rt.cudaMemcpyAsync(ptr, host.ctypes.data, host.nbytes, kind, session.stream),
                        "cudaMemcpyAsync (host to device)")
            session.context.set_tensor_address(name, ptr)
            session.in_flight[name] = host
        shapes = {}
        for name in self._tensor_names(trt.TensorIOMode.OUTPUT):
            shape = _dims(session.context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise BackendError(f"Output {name!r} has a data-dependent shape {shape}; this runner needs "
                                   "output shapes that follow from the input shapes.")
            nbytes = int(np.prod(shape, dtype=np.int64)) * _numpy_dtype(session.engine, name).itemsize
            session.context.set_tensor_address(name, session.buffer(name).reserve(nbytes))
            shapes[name] = shape
        return shapes

    def _execute(self) -> None:
        session = self._active()
        if not session.context.execute_async_v3(int(session.stream)):
            raise BackendError(f"TensorRT execute_async_v3 failed: {session.logger.last_errors()}.")

    def _infer(self, feed: dict[str, np.ndarray], outputs: list[str] | None) -> dict[str, np.ndarray]:
        session, rt = self._active(), cudart()
        shapes = self._prepare(feed)
        wanted = list(shapes) if outputs is None else list(outputs)
        for name in wanted:
            if name not in shapes:
                raise unknown("output", name, shapes, error=DataError)
        self._execute()
        kind = rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        results = {}
        for name in wanted:
            host = np.empty(shapes[name], dtype=_numpy_dtype(session.engine, name))
            cuda_check(rt.cudaMemcpyAsync(host.ctypes.data, session.buffers[name].ptr, host.nbytes, kind,
                                               session.stream), "cudaMemcpyAsync (device to host)")
            results[name] = host
        cuda_check(rt.cudaStreamSynchronize(session.stream), "cudaStreamSynchronize")
        session.in_flight.clear()
        return results

    def measure_latency(self, feed: Mapping[str, np.ndarray], iterations: int = 100,
                        warmup: int = 10) -> LatencyResult:
        """Times the engine on ``feed`` with CUDA events around each ``execute_async_v3``.

        Args:
            feed: One checked feed; its shapes select the profile point that is timed.
            iterations: Timed runs.
            warmup: Untimed runs first (the first run after a shape change is slower).

        Returns:
            The per-iteration GPU times.

        Raises:
            ConfigError: ``iterations`` < 1 or ``warmup`` < 0.
            BackendError: The runner is not active or a CUDA/TensorRT call failed.
            DataError: The feed does not match the model's inputs.
        """
        if iterations < 1 or warmup < 0:
            raise ConfigError(f"iterations must be >= 1 and warmup >= 0, got {iterations} and {warmup}.")
        session, rt = self._active(), cudart()
        checked = check_feed(feed, self.input_specs())
        self._prepare(checked)
        for _ in range(warmup):
            self._execute()
        start = cuda_check(rt.cudaEventCreate(), "cudaEventCreate")
        end = cuda_check(rt.cudaEventCreate(), "cudaEventCreate")
        times = []
        try:
            for _ in range(iterations):
                cuda_check(rt.cudaEventRecord(start, session.stream), "cudaEventRecord")
                self._execute()
                cuda_check(rt.cudaEventRecord(end, session.stream), "cudaEventRecord")
                cuda_check(rt.cudaEventSynchronize(end), "cudaEventSynchronize")
                elapsed = cuda_check(rt.cudaEventElapsedTime(start, end), "cudaEventElapsedTime")
                times.append(float(elapsed))
        finally:
            rt.cudaEventDestroy(start)
            rt.cudaEventDestroy(end)
            session.in_flight.clear()
        return LatencyResult(tuple(times), {name: tuple(a.shape) for name, a in checked.items()})

    def layer_precisions(self) -> tuple[LayerPrecision, ...]:
        """Each engine layer's precision, formats and tactic, from the engine inspector.

        With dynamic shapes the inspector only reports formats for concrete shapes, so if no input
        shape has been set yet (no ``infer`` so far) the profile's opt shapes are set first.

        Returns:
            The layers in engine order (see :func:`parse_engine_info`).

        Raises:
            BackendError: The runner is not active.
        """
        session = self._active()
        for name in self._tensor_names(trt.TensorIOMode.INPUT):
            if any(d < 0 for d in _dims(session.context.get_tensor_shape(name))):
                opt = session.engine.get_tensor_profile_shape(name, 0)[1]
                session.context.set_input_shape(name, opt)
        inspector = session.engine.create_engine_inspector()
        inspector.execution_context = session.context
        return parse_engine_info(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
