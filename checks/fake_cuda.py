"""A fake ``torch.cuda`` on CPU tensors, so the CPU suite walks the engine's CUDA branches.

Mistakes that only a GPU would show (an unindexed device handed to ``set_device``, a stream that never waits,
a synchronising copy from pageable memory in the middle of a step, a host copy read before its event) are
caught here, on the CPU, before the one run a lent GPU allows.

While :func:`fake_cuda` is active:

- ``torch.cuda.is_available()`` is true and the CUDA entry points the engine uses are replaced by fakes that
  validate their arguments exactly as torch does (``set_device`` refuses ``cuda`` without an index) and append
  what happened to :attr:`FakeCuda.log`: stream switches, ``wait_stream``, event ``record`` / ``synchronize``,
  graph capture and replay;
- a :class:`~torch.overrides.TorchFunctionMode` places every tensor asked for on ``cuda`` on the CPU instead
  (factory ``device=`` arguments, ``.to(cuda)``, ``pin_memory``), so the real computation still runs;
- host-to-device copies are judged: a copy from pageable memory (``torch.tensor(list, device=cuda)``, or
  ``.to(cuda)`` of a tensor that was not pinned) while the engine stream is current or a graph is being
  captured is recorded in :attr:`FakeCuda.violations` — on a GPU it would stall the host or break the capture.

Tensors stay CPU tensors, so ``tensor.device`` still says ``cpu``: code that branches on the configured
device (``engine.device``) takes its CUDA branch, code that branches on a tensor's device takes its CPU one.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.cuda._utils import _get_device_index
from torch.overrides import TorchFunctionMode

__all__ = ["FakeCuda", "fake_cuda"]

FREE_BYTES = 256 << 20  # what the fake driver reports free: small, so an engine sized from it stays small
TOTAL_BYTES = 1 << 30


def _is_cuda(device: Any) -> bool:
    if isinstance(device, int):
        return True
    if isinstance(device, (str, torch.device)):
        return torch.device(device).type == "cuda"
    return False


def _checked_index(device: Any) -> int:
    """What torch's own optional-index entry points (``Stream``, ``current_stream``, ``mem_get_info``) accept."""
    if device is None:
        return 0
    if not _is_cuda(device):
        raise ValueError(f"Expected a cuda device, but got: {device}")
    return _get_device_index(device, optional=True) if torch.device(device).index is not None else 0


class FakeStream:
    """A named stream: ``wait_stream`` and ``wait_event`` only append to the log."""

    _ids = itertools.count()

    def __init__(self, cuda: FakeCuda, device: Any = None, priority: int = 0, name: str | None = None) -> None:
        _checked_index(device)
        self.cuda, self.name = cuda, name or f"stream{next(self._ids)}"
        cuda.log.append(("new_stream", self.name))

    def wait_stream(self, other: FakeStream) -> None:
        if not isinstance(other, FakeStream):
            raise TypeError(f"wait_stream expects a Stream, got {type(other).__name__}")
        self.cuda.log.append(("wait_stream", self.name, other.name))

    def wait_event(self, event: FakeEvent) -> None:
        self.cuda.log.append(("wait_event", self.name, event.name))

    def record_event(self, event: FakeEvent | None = None) -> FakeEvent:
        event = event or FakeEvent(self.cuda)
        event.record(self)
        return event

    def synchronize(self) -> None:
        self.cuda.log.append(("stream_sync", self.name))

    def query(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"<FakeStream {self.name}>"


class FakeEvent:
    """An event that remembers the stream it was recorded on and whether the host waited for it."""

    _ids = itertools.count()

    def __init__(self, cuda: FakeCuda, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.cuda, self.name = cuda, f"event{next(self._ids)}"
        self.stream: str | None = None
        self.waited = False

    def record(self, stream: FakeStream | None = None) -> None:
        self.stream = (stream or self.cuda.current).name
        self.cuda.log.append(("record", self.name, self.stream))

    def synchronize(self) -> None:
        if self.stream is None:
            self.cuda.violations.append(f"{self.name}.synchronize() before the event was recorded")
        self.waited = True
        self.cuda.log.append(("event_sync", self.name))

    def wait(self, stream: FakeStream | None = None) -> None:
        (stream or self.cuda.current).wait_event(self)

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: FakeEvent) -> float:
        if self.stream is None or end.stream is None:
            raise RuntimeError("elapsed_time needs both events recorded")
        return 0.0


class FakeGraph:
    """A CUDA graph that records nothing: replay only logs (the numbers of the graph path are checked in eager mode)."""

    _ids = itertools.count()

    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda, self.name, self.captured = cuda, f"graph{next(self._ids)}", False

    def replay(self) -> None:
        if not self.captured:
            raise RuntimeError("replay() of a graph that was never captured")
        self.cuda.log.append(("replay", self.name, self.cuda.current.name))

    def pool(self) -> tuple[str, str]:
        return ("pool", self.name)


class _CudaOnCpu(TorchFunctionMode):
    """Puts every tensor asked for on ``cuda`` on the CPU, and judges host-to-device copies."""

    def __init__(self, cuda: FakeCuda) -> None:
        super().__init__()
        self.cuda = cuda

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = dict(kwargs or {})
        pinned = kwargs.pop("pin_memory", False)
        if _is_cuda(kwargs.get("device")) and not isinstance(kwargs.get("device"), int):
            kwargs["device"] = "cpu"
            if func is torch.tensor:
                self.cuda.judge_copy(pinned=False, non_blocking=False, what="torch.tensor(data, device=cuda)")
        if func is torch.Tensor.pin_memory:
            return self.cuda.pinned(args[0].clone())
        if func in (torch.Tensor.cuda,):
            return args[0]
        if func is torch.Tensor.to:
            target = [a for a in args[1:] if isinstance(a, (str, torch.device))] + [kwargs.get("device")]
            if any(_is_cuda(t) for t in target if t is not None):
                self.cuda.judge_copy(pinned=getattr(args[0], "_fake_pinned", False),
                                     non_blocking=bool(kwargs.get("non_blocking")), what="tensor.to(cuda)")
                args = (args[0], *["cpu" if isinstance(a, (str, torch.device)) and _is_cuda(a) else a for a in args[1:]])
                if _is_cuda(kwargs.get("device")):
                    kwargs["device"] = "cpu"
        out = func(*args, **kwargs)
        return self.cuda.pinned(out) if pinned and isinstance(out, torch.Tensor) else out


class FakeCuda:
    """The fake's state: the log of stream / event / graph calls and the violations found."""

    def __init__(self) -> None:
        self.log: list[tuple[str, ...]] = []
        self.violations: list[str] = []
        self.default = FakeStream(self, name="default")
        self.stack: list[FakeStream] = []
        self.capturing = False
        self.set_device_calls: list[Any] = []

    @property
    def current(self) -> FakeStream:
        return self.stack[-1] if self.stack else self.default

    def pinned(self, t: torch.Tensor) -> torch.Tensor:
        t._fake_pinned = True  # type: ignore[attr-defined]
        return t

    def judge_copy(self, pinned: bool, non_blocking: bool, what: str) -> None:
        """A copy from pageable memory, or a blocking one, stalls the host: not allowed inside a step or a capture."""
        if pinned and non_blocking:
            return
        where = "during graph capture" if self.capturing else f"on {self.current.name}" if self.current is not self.default else None
        if where is not None:
            kind = "from pageable memory" if not pinned else "without non_blocking"
            self.violations.append(f"{what} {kind} {where} (a synchronising copy)")

    # ------------------------------------------------------------------ the torch.cuda surface

    def set_device(self, device: Any) -> None:
        self.set_device_calls.append(device)
        _get_device_index(device, optional=False)  # torch's own check: raises for an unindexed "cuda"

    @contextlib.contextmanager
    def stream(self, stream: FakeStream | None) -> Iterator[None]:
        if stream is None:
            yield
            return
        self.stack.append(stream)
        self.log.append(("enter", stream.name))
        try:
            yield
        finally:
            self.stack.pop()
            self.log.append(("exit", stream.name))

    def current_stream(self, device: Any = None) -> FakeStream:
        _checked_index(device)
        return self.current

    def default_stream(self, device: Any = None) -> FakeStream:
        _checked_index(device)
        return self.default

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        _checked_index(device)
        return FREE_BYTES, TOTAL_BYTES

    def synchronize(self, device: Any = None) -> None:
        _checked_index(device)
        self.log.append(("device_sync",))

    @contextlib.contextmanager
    def graph(self, graph: FakeGraph, pool: Any = None, stream: FakeStream | None = None, **_: Any) -> Iterator[FakeGraph]:
        if self.capturing:
            raise RuntimeError("nested graph capture")
        capture = stream or FakeStream(self, name=f"capture-{graph.name}")
        self.log.append(("capture_begin", graph.name, "pool" if pool is not None else "new-pool"))
        self.capturing = True
        try:
            with self.stream(capture):
                yield graph
        finally:
            self.capturing = False
            graph.captured = True
            self.log.append(("capture_end", graph.name))

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        cuda = torch.cuda
        fakes = {
            "is_available": lambda: True,
            "device_count": lambda: 1,
            "current_device": lambda: 0,
            "get_device_name": lambda device=None: "FakeGPU",
            "set_device": self.set_device,
            "Stream": lambda device=None, priority=0, **kw: FakeStream(self, device, priority),
            "Event": lambda *a, **kw: FakeEvent(self, *a, **kw),
            "CUDAGraph": lambda *a, **kw: FakeGraph(self),
            "stream": self.stream,
            "current_stream": self.current_stream,
            "default_stream": self.default_stream,
            "mem_get_info": self.mem_get_info,
            "synchronize": self.synchronize,
            "empty_cache": lambda: None,
            "graph": self.graph,
        }
        for name, fake in fakes.items():
            monkeypatch.setattr(cuda, name, fake)
        real_generator = torch.Generator

        def generator(device: Any = "cpu") -> torch.Generator:
            return real_generator(device="cpu" if _is_cuda(device) else device)

        monkeypatch.setattr(torch, "Generator", generator)


@contextlib.contextmanager
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCuda]:
    """Within the block, the process believes it has one CUDA GPU; yields the fake's log and violations."""
    cuda = FakeCuda()
    cuda.install(monkeypatch)
    with _CudaOnCpu(cuda):
        yield cuda
