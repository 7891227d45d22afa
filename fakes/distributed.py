"""The distributed weight transport (``/init_weights_update_group`` + ``/update_weights_from_distributed``).

``DistributedGroup`` joins a real ``torch.distributed`` gloo group built exactly like SGLang's
``init_custom_process_group`` builds its group (rendezvous ``tcp://`` TCPStore hosted by rank 0,
``PrefixStore(group_name)``, then the ``"{group_name}/"`` and ``"cpu/"`` prefixes ``_new_process_group_helper``
adds), but without touching torch's global process-group registry, so several ranks (fake engines, the trainer)
can live in one process. A trainer that uses SGLang-style ``init_custom_process_group(backend="gloo", ...)`` +
``dist.broadcast(t, src=0, group=g)`` interoperates."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Mapping
from typing import Any, Callable

from .dtypes import _dtype_name
from .tensors import TensorBlob, _as_blobs
from .weight_errors import WeightError, first_line as _first_line


def _local_ip_towards(master: str) -> str | None:
    """The local address gloo should bind so that peers (which reach ``master``) can reach us."""
    if master in ("localhost", "::1") or master.startswith("127."):
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master, 9))  # UDP connect sends nothing; it picks the route
            return s.getsockname()[0]
    except OSError:
        return None


def distributed_metadata(named: Mapping[str, Any]) -> dict[str, list]:
    """The ``names``/``dtypes``/``shapes`` fields of ``/update_weights_from_distributed`` for ``named``."""
    blobs = _as_blobs(named)
    return {"names": list(blobs), "dtypes": [b.dtype for b in blobs.values()],
            "shapes": [list(b.shape) for b in blobs.values()]}


FLATTENED_BUCKET = "flattened_bucket"
"""The ``load_format`` of ``/update_weights_from_distributed`` (SGLang 0.5.6+) that sends a whole bucket in one
broadcast; any other value takes the per-tensor path (``model_executor/model_runner.py``
``update_weights_from_distributed`` tests only for this string, 0.5.6–0.5.23)."""


def flattened_bucket(tensors: list[tuple[str, Any]]) -> tuple[Any, Callable[[], list[tuple[str, Any]]]]:
    """SGLang's ``weight_sync/tensor_bucket.py`` ``FlattenedTensorBucket`` layout: every tensor flattened to its
    bytes (``uint8``) and concatenated in order. Returns the flat tensor and a function giving each tensor back
    (``reconstruct_tensors``: the byte range viewed as the dtype, reshaped), to call once the flat tensor holds the
    received bytes."""
    import torch  # lazy

    flat = torch.cat([t.contiguous().reshape(-1).view(torch.uint8) for _, t in tensors]) if tensors \
        else torch.empty(0, dtype=torch.uint8)
    bounds, start = [], 0
    for name, t in tensors:
        size = t.numel() * t.element_size()
        bounds.append((name, t.dtype, t.shape, start, start + size))
        start += size

    def views() -> list[tuple[str, Any]]:
        return [(name, flat[a:b].view(dtype).reshape(shape).clone()) for name, dtype, shape, a, b in bounds]
    return flat, views


class DistributedGroup:
    """One rank of a weight-update group: a real gloo process group, outside torch's global registry.

    Rank 0 is the trainer (it hosts the TCPStore); engine ranks are ``rank_offset + tp_rank``. ``receive`` and
    ``send`` block; run them in threads (one per rank) when several ranks live in one process."""

    def __init__(self, *, pg: Any, store: Any, rank: int, world_size: int, group_name: str, backend: str,
                 master_address: str, master_port: int, timeout_s: float):
        self._pg = pg
        self._store = store
        self.rank = rank
        self.world_size = world_size
        self.group_name = group_name
        self.backend = backend  # as requested ("nccl" or "gloo"); the transport is always gloo
        self.master_address = master_address
        self.master_port = master_port
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._broken: str | None = None

    def __repr__(self) -> str:
        state = "destroyed" if self._pg is None else ("broken" if self._broken else "ready")
        return (f"DistributedGroup({self.group_name!r}, rank={self.rank}/{self.world_size}, "
                f"{self.master_address}:{self.master_port}, {state})")

    @property
    def closed(self) -> bool:
        return self._pg is None

    @classmethod
    def join(cls, master_address: str, master_port: int, rank: int, world_size: int, group_name: str,
             backend: str = "gloo", timeout_s: float = 60.0) -> DistributedGroup:
        """Join the group (blocking rendezvous; every rank must call it). Fails with ``WeightError`` within
        ``timeout_s`` when the other ranks do not all show up."""
        if not isinstance(world_size, int) or world_size < 1:
            raise WeightError(f"world_size must be a positive int, got {world_size!r}")
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise WeightError(f"rank {rank!r} is outside [0, {world_size}) (rank = rank_offset + tp_rank)")
        if not isinstance(master_port, int) or not 0 < master_port < 65536:
            raise WeightError(f"master_port must be an int in (0, 65536), got {master_port!r}")
        if not group_name or not isinstance(group_name, str):
            raise WeightError(f"group_name must be a non-empty string, got {group_name!r}")
        # SGLang's engines default to backend="nccl". The fake runs on CPU, where NCCL does not exist, so
        # "nccl" is served by gloo (same rendezvous, same broadcast semantics). Anything else is refused.
        if str(backend).lower() not in ("nccl", "gloo"):
            raise WeightError(f"unsupported backend {backend!r}: the fake supports 'gloo' (and maps 'nccl' to gloo)")
        if timeout_s <= 0:
            raise WeightError(f"timeout_s must be positive, got {timeout_s}")
        try:
            import torch.distributed as dist  # lazy
        except ImportError:
            raise WeightError("the distributed weight transport needs torch, which is not installed") from None
        if not dist.is_available() or not dist.is_gloo_available():
            raise WeightError("this torch build has no torch.distributed gloo backend")

        lock = threading.Lock()
        state: dict[str, Any] = {}
        done = threading.Event()

        def connect() -> None:
            try:
                made = _make_gloo_group(master_address, master_port, rank, world_size, group_name, deadline)
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                with lock:
                    state["error"] = e
            else:
                with lock:
                    if state.get("abandoned"):
                        _shutdown_pg(made[0])  # the caller gave up: leave nothing behind
                    else:
                        state["ok"] = made
            finally:
                done.set()

        # The rendezvous runs in its own thread so that the caller gets an answer within timeout_s even where
        # torch's own timeouts overshoot a little. Not a daemon: a thread still inside torch's C++ rendezvous
        # when the interpreter exits aborts the process; every phase is bounded by the deadline, so exit
        # waits at most about a second for it.
        deadline = time.monotonic() + timeout_s
        thread = threading.Thread(target=connect, name=f"weights-join-{group_name}-r{rank}")
        thread.start()
        done.wait(timeout_s)
        where = f"weight update group {group_name!r} at {master_address}:{master_port} as rank {rank} of {world_size}"
        with lock:
            if "ok" in state:
                pg, store = state["ok"]
                return cls(pg=pg, store=store, rank=rank, world_size=world_size, group_name=group_name,
                           backend=str(backend).lower(), master_address=master_address,
                           master_port=master_port, timeout_s=timeout_s)
            err = state.get("error")
            timed_out = err is None or isinstance(err, TimeoutError) or time.monotonic() >= deadline - 0.05 or (
                "timed out" in str(err).lower() or "timeout" in type(err).__name__.lower())
            if timed_out:
                state["abandoned"] = True
                cause = "" if err is None else f" ({type(err).__name__}: {_first_line(err)})"
                hint = ("the engines did not all join (check world_size and that every engine got "
                        "/init_weights_update_group)") if rank == 0 else (
                        "the trainer (rank 0) is not hosting the rendezvous there, or not every rank joined "
                        "(check master_address/master_port, rank_offset and world_size)")
                raise WeightError(f"Timed out after {timeout_s:g}s joining {where}: {hint}{cause}")
        raise WeightError(f"Failed to join {where}: {type(err).__name__}: {_first_line(err)}")

    def _check_usable(self) -> None:
        if self._pg is None:
            raise WeightError(f"weight update group {self.group_name!r} has been destroyed")
        if self._broken:
            raise WeightError(
                f"weight update group {self.group_name!r} is unusable after an earlier failure ({self._broken}); "
                f"destroy it and initialise a new one")

    def _broadcast(self, tensor: Any, name: str, timeout_s: float) -> None:
        import datetime

        import torch
        import torch.distributed as dist

        wire = tensor
        if str(tensor.dtype).startswith("torch.float8"):  # gloo has no float8: same bytes as uint8
            wire = tensor.view(torch.uint8)
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        # the operation's own timeout, not only the wait's: an abandoned broadcast must not outlive it (a group
        # with one in flight cannot be torn down before it expires)
        opts.timeout = datetime.timedelta(seconds=timeout_s)
        try:
            work = self._pg.broadcast([wire], opts)
            work.wait(datetime.timedelta(seconds=timeout_s))
        except Exception as e:  # noqa: BLE001 - gloo raises RuntimeError / DistError subclasses
            self._broken = f"broadcast of {name!r} failed: {_first_line(e)}"
            raise WeightError(
                f"broadcast of {name!r} in weight update group {self.group_name!r} (rank {self.rank}) failed: "
                f"{_first_line(e)} (did every rank issue the same broadcasts in the same order?)") from None

    def receive(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                timeout_s: float | None = None, load_format: str | None = None) -> dict[str, TensorBlob]:
        """Receive the tensors from rank 0 (what SGLang's model runner does for ``/update_weights_from_distributed``):
        one broadcast per tensor, in order; with ``load_format="flattened_bucket"`` one broadcast of every tensor's
        bytes concatenated in order (:func:`flattened_bucket`). Blocking; ``timeout_s`` per broadcast (default: the
        join timeout). A failure or timeout leaves the group unusable (the other ranks are out of step)."""
        import torch  # lazy

        if not (len(names) == len(dtypes) == len(shapes)):
            raise WeightError(
                f"names, dtypes and shapes must have the same length, got {len(names)}, {len(dtypes)}, {len(shapes)}")
        specs = []
        for name, dtype, shape in zip(names, dtypes, shapes):
            try:
                dt = _dtype_name(dtype)
                shp = tuple(int(d) for d in shape)
            except (WeightError, TypeError, ValueError) as e:
                raise WeightError(f"parameter {name!r}: {e}") from None
            specs.append((name, dt, shp))
        timeout = self.timeout_s if timeout_s is None else timeout_s
        out: dict[str, TensorBlob] = {}
        tensors = [(name, torch.empty(shp, dtype=getattr(torch, dt))) for name, dt, shp in specs]
        with self._lock:
            self._check_usable()
            if load_format == FLATTENED_BUCKET:
                flat, views = flattened_bucket(tensors)
                self._broadcast(flat, f"flattened bucket of {len(tensors)} tensor(s)", timeout)
                tensors = views()
            else:
                for name, tensor in tensors:
                    self._broadcast(tensor, name, timeout)
        out.update((name, TensorBlob.from_torch(tensor)) for name, tensor in tensors)
        return out

    def send(self, named: Mapping[str, Any], timeout_s: float | None = None, load_format: str | None = None) -> None:
        """Rank 0 only: broadcast every tensor, in mapping order (one broadcast of their bytes concatenated with
        ``load_format="flattened_bucket"``, as SGLang's ``FlattenedTensorBucket`` packs them). Blocking."""
        if self.rank != 0:
            raise WeightError(f"only rank 0 (the trainer) sends; this is rank {self.rank}")
        tensors = [(name, blob.to_torch()) for name, blob in _as_blobs(named).items()]
        timeout = self.timeout_s if timeout_s is None else timeout_s
        with self._lock:
            self._check_usable()
            if load_format == FLATTENED_BUCKET:
                self._broadcast(flattened_bucket(tensors)[0], f"flattened bucket of {len(tensors)} tensor(s)", timeout)
                return
            for name, tensor in tensors:
                self._broadcast(tensor, name, timeout)

    def destroy(self) -> None:
        """Leave the group and release its resources. Idempotent."""
        with self._lock:
            pg, self._pg = self._pg, None
            self._store = None
        if pg is not None:
            # a broken group may still have a broadcast in flight: shutdown() would wait for it to time out
            _shutdown_pg(pg, abort=self._broken is not None)

    def __enter__(self) -> DistributedGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


def _wait_for_listener(host: str, port: int, deadline: float) -> None:
    """Block until something accepts TCP connections at host:port (the trainer's TCPStore), or the deadline.

    torch's TCPStore client retries well past its own timeout when nobody listens; probing first keeps the
    whole rendezvous inside the caller's deadline."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"nothing accepted connections at {host}:{port}")
        try:
            with socket.create_connection((host, port), timeout=min(remaining, 1.0)):
                return
        except OSError:
            threading.Event().wait(min(0.05, max(0.0, deadline - time.monotonic())))


def _make_gloo_group(master_address: str, master_port: int, rank: int, world_size: int, group_name: str,
                     deadline: float) -> tuple[Any, Any]:
    """Build the group the way SGLang's ``init_custom_process_group`` + torch's ``_new_process_group_helper``
    do for gloo, minus the global registration: ``rendezvous("tcp://host:port")`` (rank 0 hosts a
    multi-tenant TCPStore), ``PrefixStore(group_name)``, ``PrefixStore(group_name + "/")``,
    ``PrefixStore("cpu/")``, ``ProcessGroupGloo`` and the sequence-number handshake. Every phase is bounded
    by ``deadline`` (``time.monotonic()``)."""
    import datetime

    import torch.distributed as dist
    from torch.distributed import PrefixStore, ProcessGroupGloo

    def left() -> datetime.timedelta:
        return datetime.timedelta(seconds=max(0.001, deadline - time.monotonic()))

    if rank != 0:
        _wait_for_listener(master_address, master_port, deadline)
    host = f"[{master_address}]" if ":" in master_address else master_address
    store, _, _ = next(dist.rendezvous(f"tcp://{host}:{master_port}", rank, world_size, timeout=left()))
    store.set_timeout(left())
    group_store = PrefixStore(group_name, store)
    backend_store = PrefixStore("cpu/", PrefixStore(f"{group_name}/", group_store))
    opts = ProcessGroupGloo._Options()
    opts._timeout = left()
    local_ip = _local_ip_towards(master_address)
    if local_ip is not None:
        opts._devices = [ProcessGroupGloo.create_device(hostname=local_ip)]
    else:
        opts._devices = [ProcessGroupGloo.create_default_device()]
    pg = ProcessGroupGloo(backend_store, rank, world_size, opts)
    pg._set_sequence_number_for_group()
    return pg, store


def _shutdown_pg(pg: Any, abort: bool = False) -> None:
    try:
        pg.abort() if abort else pg.shutdown()
    except Exception:  # noqa: BLE001 - best effort: a peer may already be gone
        pass


def trainer_group(master_address: str, master_port: int, world_size: int, group_name: str,
                  timeout_s: float = 60.0) -> DistributedGroup:
    """Rank 0 (the trainer) of a weight-update group: hosts the rendezvous, then ``.send(named)``."""
    return DistributedGroup.join(master_address, master_port, 0, world_size, group_name, "gloo", timeout_s)
