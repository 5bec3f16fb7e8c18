"""Type stubs for ``loader._native``, the compiled half of the SDK."""

import os
from collections.abc import Iterator
from typing import Any, Optional, TypedDict, Union

import numpy as np

STATE_FORMAT: int

class LoaderOptions(TypedDict, total=False):
    """How a loader delivers batches: the keywords of ``loader.Loader`` and
    ``loader.Loader.local`` (documented in ``loader.Loader``), the Rust
    SDK's ``LoaderOptions``. A missing one keeps the default
    (``loader.DEFAULT_OPTIONS``). For type checkers only: the module has
    no such name at run time."""

    prefetch: int
    in_order: bool
    shared_memory: bool
    ring: Optional[tuple[int, int]]
    ring_dir: Optional[Union[str, os.PathLike[str]]]
    allow_ring_peer_uids: list[int]
    coordinator_timeout: float
    metrics_listen: Optional[str]
    device: str
    device_prefetch: int

class LoaderError(RuntimeError):
    """Loading failed: a worker or the coordinator could not deliver, or the job failed."""

class TensorView:
    """One tensor of a batch; numpy (buffer protocol, read-only) and DLPack
    consumers view it without copying and keep its memory alive."""

    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def data_ptr(self) -> int: ...
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Optional[tuple[int, int]] = None,
        dl_device: Optional[tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]:
        """``(1, 0)`` (kDLCPU), or ``(2, N)`` (kDLCUDA) for a batch on GPU N."""
    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:N"``."""
    def __buffer__(self, flags: int, /) -> memoryview: ...

class Batch:
    """A read-only mapping of tensor name to zero-copy numpy array.

    The batch's memory (a shared-memory slot) is reused once the batch and
    every array, memoryview or tensor made from it are freed."""

    def __getitem__(self, name: str) -> np.ndarray: ...
    def __len__(self) -> int: ...
    def __contains__(self, name: object) -> bool: ...
    def __iter__(self) -> Iterator[str]: ...
    def keys(self) -> list[str]: ...
    def values(self) -> list[np.ndarray]: ...
    def items(self) -> list[tuple[str, np.ndarray]]: ...
    def get(self, name: str, default: Any = None) -> Any: ...
    def numpy(self) -> dict[str, np.ndarray]:
        """A plain dict of the same zero-copy arrays."""
    def torch(self) -> dict[str, Any]:
        """A dict of ``torch.Tensor`` over the same memory (DLPack, no copy);
        CUDA tensors for a loader with ``device="cuda:N"``, ordered after the
        batch's copy on torch's current stream."""
    def views(self) -> dict[str, TensorView]:
        """The raw zero-copy views, for any DLPack or buffer consumer."""
    @property
    def device(self) -> str:
        """Where the tensors live: ``"cpu"``, ``"cuda:N"`` or ``"host"``."""
    @property
    def epoch(self) -> int: ...
    @property
    def seq(self) -> int:
        """Sequence number over the whole job: ``epoch * len(loader) + index_in_epoch``."""
    @property
    def index_in_epoch(self) -> int: ...
    @property
    def indices(self) -> list[int]:
        """Dataset indices of the samples, in batch order."""
    @property
    def num_samples(self) -> int: ...
    @property
    def transport(self) -> str:
        """``"shared_memory"`` or ``"grpc"``."""

class NativeLoader:
    @staticmethod
    def open(
        spec: bytes,
        options: str,
        *,
        coordinator: Optional[str] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        resume: Optional[str] = None,
        start_at: Optional[int] = None,
        local: Optional[tuple[int, list[str], float]] = None,
        template: Optional[tuple[Any, int, Optional["SampleCache"]]] = None,
    ) -> NativeLoader:
        """A loader on ``spec`` with ``options`` (the JSON of
        ``LoaderOptions``, as ``check_options`` returns it), fed by the
        coordinator at ``coordinator`` or, with ``local=(workers,
        worker_command, ready_timeout)``, by embedded mode."""
    def next(self, timeout: Optional[float] = None) -> Optional[Batch]: ...
    def state(self) -> str: ...
    def yielded(self) -> int: ...
    def batches_per_epoch(self) -> int: ...
    def total_batches(self) -> int: ...
    def ring_slots(self) -> Optional[tuple[int, int, int]]: ...
    def ring_socket(self) -> Optional[str]: ...
    def device(self) -> str: ...
    def device_fallback(self) -> Optional[str]: ...
    def worker_pids(self) -> list[int]: ...
    def coordinator_address(self) -> Optional[str]: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...

def default_options() -> str:
    """Every option with its default, as the JSON of ``LoaderOptions``."""
def check_options(options: str) -> str:
    """Checks options given as JSON (missing ones keep their default) and
    returns them whole as JSON; ``ValueError`` names a bad or unknown one."""
def parse_spec(text: str, base_dir: str) -> bytes: ...
def parse_spec_file(path: str) -> bytes: ...
def blob_dir() -> str:
    """The host's blob directory (``$LOADER_BLOB_DIR``, else
    ``$XDG_RUNTIME_DIR/loader-blobs``, else ``$TMPDIR/loader-blobs-<uid>``),
    created 0700 if needed; ``OSError`` when it is not this user's."""
def plan(spec: bytes, rank: int, world_size: Optional[int] = None) -> tuple[int, int, int, bool, int]: ...
def frame_cache_entries(spec: bytes) -> Optional[int]: ...

#: Batches of each rank per lane's turn of a job read as lanes.
LANE_TURN: int
def resume_state(
    state: str,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    batch_size: Optional[int] = None,
    spec: Optional[bytes] = None,
) -> tuple[str, int, int, int]: ...
def merge_states(states: list[str]) -> str: ...
def run_worker(argv: list[str]) -> int: ...
def worker_log(message: str) -> None: ...

class SampleCache:
    """A sample cache mapped in this process (``loader._cache``)."""

    @staticmethod
    def create(entries: int, capacity: int, dir: Optional[str] = None) -> SampleCache: ...
    @staticmethod
    def open(fd: int, entries: int) -> SampleCache: ...
    def fd(self) -> int: ...
    def get(self, index: int) -> Optional[bytearray]: ...
    def put(self, index: int, parts: list[Any]) -> bool: ...
    def record_hit(self, nanos: Optional[int] = None) -> None: ...
    def time_hit(self, nanos: int) -> None: ...
    def record_miss(self, nanos: int) -> None: ...
    def is_on(self) -> bool: ...
    def turn_off(self, why: str) -> None: ...
    def stats(self) -> dict[str, Any]: ...
    def payoff(self, epochs: int) -> Optional[tuple[bool, float, float, float]]:
        """``(pays, load_ns, store_ns, hit_ns)`` once enough is timed: the
        worker's rule (``CachePayoff``), for both kinds of cache."""

#: Timed loads and reads back before a sample cache decides whether it pays.
CACHE_DECIDE_AFTER: int
def flush_telemetry() -> None: ...
def sample_seed(seed: int, epoch: int, index: int) -> int: ...
def batch_len(batch_size: int, tensors: list[tuple[str, str, list[int]]]) -> Optional[int]:
    """Bytes of a batch of these ``(name, dtype, shape)`` tensors in the batch
    format (None: no worker could lay it out)."""
def ring_for_batch(batch_bytes: int, prefetch: int, workers: int, page: int) -> tuple[int, int, int]:
    """``(window, slots, slot_bytes)`` of a ring for batches of ``batch_bytes``."""
def batch_bytes(spec: bytes) -> Optional[int]:
    """Bytes of one batch of a built-in dataset's job (None: a Python dataset's)."""

#: Bytes of a ring slot unless the options say otherwise.
DEFAULT_SLOT_SIZE: int
def random_resized_crop_box(
    width: int, height: int, scale: list[float], ratio: list[float], seed: int, epoch: int, index: int, step: int
) -> tuple[int, int, int, int]:
    """(left, top, width, height) of the crop that native step ``step`` (a
    random_resized_crop) cuts for a sample: the parity tests' hook."""
def flip_drawn(p: float, seed: int, epoch: int, index: int, step: int) -> bool:
    """Whether native step ``step`` (a horizontal_flip) mirrors a sample."""
