"""fakes/weights.py distributed transport: a real gloo group on 127.0.0.1 with the trainer (rank 0) and fake
engine ranks in one process, each rank in its own thread (as the engine runs them)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from fakes.weights import (
    DistributedGroup,
    WeightError,
    WeightStore,
    distributed_metadata,
    perturbed,
    tiny_model,
    trainer_group,
    weights_digest,
)

pytestmark = pytest.mark.cpu

import torch
import torch.distributed as dist
if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

JOIN_S = 20.0  # generous: threads must finish well before this; a hang fails the test instead of blocking CI


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Rank(threading.Thread):
    """Run fn in a thread; keep its result or exception."""

    def __init__(self, fn, *args, **kwargs):
        super().__init__(daemon=True)
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.result = self.error = None

    def run(self):
        try:
            self.result = self.fn(*self.args, **self.kwargs)
        except BaseException as e:  # noqa: BLE001 - reported by finish()
            self.error = e


def finish(*threads: Rank, timeout: float = JOIN_S) -> list:
    for t in threads:
        if t.ident is None:  # not started yet
            t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a rank is still blocked"
    errors = [t.error for t in threads if t.error is not None]
    if errors:
        raise errors[0]
    return [t.result for t in threads]


def form_group(port: int, world_size: int, group_name: str = "weight_update_group", timeout_s: float = 10.0,
               backends=None):
    """Trainer rank 0 + engine ranks 1..world_size-1, all joining concurrently (the rendezvous blocks)."""
    backends = backends or ["nccl"] * (world_size - 1)  # SGLang's engine default; the fake maps it to gloo
    ranks = [Rank(trainer_group, "127.0.0.1", port, world_size, group_name, timeout_s)]
    ranks += [Rank(DistributedGroup.join, "127.0.0.1", port, r, world_size, group_name, backends[r - 1], timeout_s)
              for r in range(1, world_size)]
    return finish(*ranks)


def test_trainer_and_two_engine_ranks_in_one_process():
    port = free_port()
    trainer, e1, e2 = form_group(port, 3)
    engines = {1: WeightStore(tiny_model(0)), 2: WeightStore(tiny_model(0))}
    try:
        assert (e1.rank, e2.rank, trainer.rank, e1.world_size) == (1, 2, 0, 3) and e1.backend == "nccl"
        for step in (1, 2):  # the group is reused across updates
            new = perturbed(tiny_model(), step)
            meta = distributed_metadata(new)  # the /update_weights_from_distributed body fields
            assert meta["dtypes"][:2] == ["float32", "bfloat16"] and meta["shapes"][0] == [64, 16]
            receivers = [Rank(g.receive, meta["names"], meta["dtypes"], meta["shapes"]) for g in (e1, e2)]
            got1, got2, _ = finish(*receivers, Rank(trainer.send, new))
            for rank, got in ((1, got1), (2, got2)):
                assert list(got) == meta["names"]
                engines[rank] = engines[rank].updated(got)
            assert engines[1].digest() == engines[2].digest() == weights_digest(new)
        # a partial update (a subset, e.g. one bucket) also arrives intact
        bucket = {n: b for n, b in perturbed(tiny_model(), 3).items() if "layers.1" in n}
        meta = distributed_metadata(bucket)
        got1, got2, _ = finish(*(Rank(g.receive, **meta) for g in (e1, e2)), Rank(trainer.send, bucket))
        assert weights_digest(got1) == weights_digest(got2) == weights_digest(bucket)
    finally:
        for g in (e1, e2, trainer):
            g.destroy()
    assert e1.closed
    with pytest.raises(WeightError, match="has been destroyed"):
        e1.receive(["x"], ["float32"], [[1]])
    e1.destroy()  # idempotent


def test_flattened_bucket_is_one_broadcast_of_the_bytes_in_order():
    """``load_format="flattened_bucket"``: the engine allocates the bucket as SGLang's FlattenedTensorBucket lays it
    out (every tensor's bytes, concatenated in order), receives one broadcast and views each tensor back; a trainer
    broadcasting that one flat uint8 tensor by hand (as frameworks do) interoperates."""
    from fakes.distributed import flattened_bucket

    port = free_port()
    trainer, e1 = form_group(port, 2)
    try:
        new = perturbed(tiny_model(), 5)
        meta = distributed_metadata(new)
        assert len(set(meta["dtypes"])) > 1  # mixed dtypes in one bucket
        got, _ = finish(Rank(e1.receive, **meta, load_format="flattened_bucket"),
                        Rank(trainer.send, new, load_format="flattened_bucket"))
        assert list(got) == meta["names"] and weights_digest(got) == weights_digest(new)
        flat, _ = flattened_bucket([(n, b.to_torch()) for n, b in new.items()])
        assert flat.dtype == torch.uint8 and flat.numel() == sum(b.to_torch().nbytes for b in new.values())
        got, _ = finish(Rank(e1.receive, **meta, load_format="flattened_bucket"),
                        Rank(lambda: trainer._broadcast(flat, "bucket", 10.0)))
        assert weights_digest(got) == weights_digest(new)
        # any other load_format takes the per-tensor path, as SGLang's model runner does
        got, _ = finish(Rank(e1.receive, **meta, load_format="auto"), Rank(trainer.send, new))
        assert weights_digest(got) == weights_digest(new)
    finally:
        e1.destroy()
        trainer.destroy()


def test_interop_with_an_sglang_style_trainer():
    """The trainer side written the way SGLang's tests / RL frameworks write it: init_custom_process_group
    (torch rendezvous + PrefixStore(group_name) + torch's _new_process_group_helper) and dist.broadcast."""
    from datetime import timedelta

    from torch.distributed.distributed_c10d import PrefixStore, _new_process_group_helper, _world

    port, world_size, group_name = free_port(), 3, "interop_group"
    new = perturbed(tiny_model(), 4)
    meta = distributed_metadata(new)

    def sglang_style_trainer():
        timeout = timedelta(seconds=10)
        store, rank, size = next(dist.rendezvous(f"tcp://127.0.0.1:{port}", 0, world_size, timeout=timeout))
        store.set_timeout(timeout)
        store = PrefixStore(group_name, store)
        pg, _ = _new_process_group_helper(size, rank, [], dist.Backend("gloo"), store, group_name=group_name,
                                          backend_options=None, timeout=timeout)
        _world.pg_group_ranks[pg] = {i: i for i in range(size)}
        return pg

    trainer = Rank(sglang_style_trainer)
    joins = [Rank(DistributedGroup.join, "127.0.0.1", port, r, world_size, group_name, "nccl", 10.0) for r in (1, 2)]
    pg, e1, e2 = finish(trainer, *joins)
    try:
        def send():
            for name in meta["names"]:
                dist.broadcast(new[name].to_torch(), src=0, group=pg)

        got1, got2, _ = finish(*(Rank(g.receive, **meta) for g in (e1, e2)), Rank(send))
        assert weights_digest(got1) == weights_digest(got2) == weights_digest(new)
    finally:
        e1.destroy()
        e2.destroy()
        dist.destroy_process_group(pg)


def test_rendezvous_timeout_when_the_trainer_never_comes():
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(WeightError) as e:
        DistributedGroup.join("127.0.0.1", port, 1, 2, "weight_update_group", "nccl", timeout_s=2.0)
    elapsed = time.monotonic() - t0
    assert elapsed < 2.0 + 1.0, elapsed
    msg = str(e.value)
    assert f"Timed out after 2s joining weight update group 'weight_update_group' at 127.0.0.1:{port} as rank 1 of 2" in msg
    assert "the trainer (rank 0) is not hosting the rendezvous" in msg


def test_rendezvous_timeout_when_an_engine_never_comes():
    port = free_port()
    t0 = time.monotonic()
    engine = Rank(DistributedGroup.join, "127.0.0.1", port, 1, 3, "g", "gloo", 1.0)
    trainer = Rank(trainer_group, "127.0.0.1", port, 3, "g", 1.0)  # rank 2 never joins
    trainer.start()
    engine.start()
    with pytest.raises(WeightError) as e:
        finish(trainer, engine)
    assert time.monotonic() - t0 < 1.0 + 1.0
    assert "Timed out after 1s" in str(e.value) or "Failed to join" in str(e.value)
    assert isinstance(engine.error, WeightError) and isinstance(trainer.error, WeightError)
    assert "check world_size" in str(trainer.error) or "Failed to join" in str(trainer.error)


def test_receive_timeout_breaks_the_group():
    port = free_port()
    trainer, engine = form_group(port, 2, timeout_s=10.0)
    try:
        t0 = time.monotonic()
        with pytest.raises(WeightError, match=r"broadcast of 'w' in weight update group 'weight_update_group' \(rank 1\) failed"):
            engine.receive(["w"], ["float32"], [[4]], timeout_s=0.5)  # the trainer sends nothing
        assert time.monotonic() - t0 < 0.5 + 1.0
        with pytest.raises(WeightError, match="unusable after an earlier failure"):
            engine.receive(["w"], ["float32"], [[4]])
    finally:
        engine.destroy()
        trainer.destroy()


def test_argument_validation():
    with pytest.raises(WeightError, match=r"rank 3 is outside \[0, 3\)"):
        DistributedGroup.join("127.0.0.1", free_port(), 3, 3, "g")
    with pytest.raises(WeightError, match="unsupported backend 'mpi'"):
        DistributedGroup.join("127.0.0.1", free_port(), 1, 2, "g", backend="mpi")
    with pytest.raises(WeightError, match="master_port"):
        DistributedGroup.join("127.0.0.1", 0, 1, 2, "g")
    port = free_port()
    trainer, engine = form_group(port, 2)
    try:
        with pytest.raises(WeightError, match="same length"):
            engine.receive(["a", "b"], ["float32"], [[1], [1]])
        with pytest.raises(WeightError, match=r"parameter 'a': unsupported dtype 'torch\.float32'"):
            engine.receive(["a"], ["torch.float32"], [[1]])
        with pytest.raises(WeightError, match="only rank 0"):
            engine.send({"a": tiny_model()["model.norm.weight"]})
        # aliases resolve like getattr(torch, name): "half" is float16
        half = {"h": torch.arange(4, dtype=torch.float16)}
        got, _ = finish(Rank(engine.receive, ["h"], ["half"], [[4]]), Rank(trainer.send, half))
        assert got["h"].dtype == "float16" and got["h"].to_torch().tolist() == [0.0, 1.0, 2.0, 3.0]
    finally:
        engine.destroy()
        trainer.destroy()


def test_float8_and_bool_travel_over_gloo():
    port = free_port()
    trainer, engine = form_group(port, 2)
    try:
        named = {"f8": torch.tensor([0.5, -2.0, 448.0]).to(torch.float8_e4m3fn), "mask": torch.tensor([True, False])}
        meta = distributed_metadata(named)
        got, _ = finish(Rank(engine.receive, **meta), Rank(trainer.send, named))
        assert got["f8"].to_torch().float().tolist() == [0.5, -2.0, 448.0]
        assert got["mask"].to_torch().tolist() == [True, False]
    finally:
        engine.destroy()
        trainer.destroy()
