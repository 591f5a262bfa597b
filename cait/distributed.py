"""Data-parallel processes under torchrun, for training and for the commands that share images over
ranks: which rank this process is, how many there are, on which device it runs, and what rank 0 alone does
(its failure is every rank's at once: no rank waits for a rank 0 that has stopped)."""

from __future__ import annotations

import os
from contextlib import contextmanager, suppress
from typing import Callable, Iterator, TypeVar

import torch
import torch.distributed as dist

from .errors import InputError
from .runtime import resolve_device

T = TypeVar("T")


class RankFailed(RuntimeError):
    """Raised on the other ranks when what rank 0 alone does failed inside (not an input error): they stop at
    once instead of waiting for rank 0 at the next collective; rank 0 keeps the exception and its traceback."""


def setup_distributed(device_arg: str) -> tuple[int, int, torch.device]:
    """(rank, world size, device). torchrun sets WORLD_SIZE/RANK/LOCAL_RANK; gloo on CPU, NCCL on GPU."""
    use_cuda = resolve_device(device_arg).type == "cuda"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, torch.device("cuda" if use_cuda else "cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if use_cuda else "gloo")
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    return dist.get_rank(), world, device


# set on an exception every rank raises at the same point (`rank_zero_does`'s): the ranks leave together
_EVERY_RANK = "_cait_raised_on_every_rank"


@contextmanager
def process_group(device_arg: str) -> Iterator[tuple[int, int, torch.device]]:
    """`setup_distributed`'s (rank, world size, device) while open; the process group, if any, is destroyed on
    exit, however the work inside ends. Raises DeviceError (one line) for a device that cannot be used."""
    rank, world, device = setup_distributed(device_arg)
    together = False
    try:
        yield rank, world, device
        together = True
    except BaseException as e:
        together = getattr(e, _EVERY_RANK, False)
        raise
    finally:
        if dist.is_initialized():
            if together:
                _let_workers_finish()
            dist.destroy_process_group()


def _let_workers_finish() -> None:
    """A barrier when every rank leaves together. A gloo worker thread drops the last collective's tensors
    after the caller has its result, and needs the GIL to do so; the group outlives destroy_process_group
    while anything (DDP, an exception's frames) holds it, so its threads live on, and a worker that asks for
    the GIL once the interpreter is finalizing aborts the process ("terminate called without an active
    exception", SIGABRT) after its last line was printed. The barrier waits for the peer with the GIL
    released, which lets the worker finish first. Never when one rank leaves alone: its peer is in another
    collective, which a barrier would not match."""
    with suppress(dist.DistError):  # a peer already gone: nothing left to wait for
        dist.barrier()


def rank_zero_does(work: Callable[[], T]) -> T | None:
    """`work()` done by rank 0 alone (writing a run's files, checking its output folder), its failure known to
    every rank at once: a collective, so every rank calls it at the same point. Without a process group it is
    `work()`.

    Args:
        work: what rank 0 does.

    Returns:
        work's value on rank 0, None on the other ranks.

    Raises the InputError work raised on every rank (each exits with rank 0's one line); any other exception
    as it was on rank 0 and as RankFailed on the others."""
    if not dist.is_initialized():
        return work()
    value, failure = None, None
    if dist.get_rank() == 0:
        try:
            value = work()
        except Exception as e:  # every rank hears of it before rank 0 goes on failing
            failure = e
    said = failure if failure is None or isinstance(failure, InputError) else f"{type(failure).__name__}: {failure}"
    said = gather_all(said)[0]
    if failure is not None:
        raise _on_every_rank(failure)
    if isinstance(said, InputError):
        raise _on_every_rank(said)
    if said is not None:
        raise _on_every_rank(RankFailed(f"rank 0 failed ({said}); its traceback says where"))
    return value


def _on_every_rank(error: BaseException) -> BaseException:
    setattr(error, _EVERY_RANK, True)
    return error


def shard_ranges(images: int, size: int) -> list[range]:
    """The image indices of every shard: consecutive runs of `size` (the last one shorter)."""
    return [range(start, min(start + size, images)) for start in range(0, images, size)]


def rank_shards(shards: int, rank: int, world: int) -> list[int]:
    """The shards rank `rank` of `world` does: every world-th one (each shard by exactly one rank). The one
    sharding rule of the commands that share images over ranks (`cait.atlas`, `cait.evaluate`)."""
    return list(range(rank, shards, world))


def rank_indices(images: int, size: int, rank: int, world: int) -> list[int]:
    """The image indices rank `rank` of `world` does, shard after shard (`shard_ranges` of `size`,
    `rank_shards`): each image once, no padding. With `size` the batch size, every batch a rank forms is a
    batch a one-process run forms too, so per-batch numbers (and their ties) are the same."""
    shards = shard_ranges(images, size)
    return [i for s in rank_shards(len(shards), rank, world) for i in shards[s]]


def balanced_runs(todo: list[int], world: int, size: int, *, batch: int = 1) -> list[list[range]]:
    """Image indices `todo` (ascending) split over `world` ranks in contiguous shares of whole batches (the
    batches of a one-process run: indices b * batch .. (b + 1) * batch - 1) whose counts differ by at most one,
    each share cut into runs of consecutive indices of at most max(batch, size // batch * batch): rank r's runs
    are element r. Every batch a rank forms is one a one-process run forms, so the numbers are the same; how
    `cait.atlas` shares its work over ranks whatever the shard size."""
    batches: list[list[int]] = []
    for i in todo:
        if batches and batches[-1][-1] == i - 1 and i % batch:
            batches[-1].append(i)
        else:
            batches.append([i])
    shares = [batches[len(batches) * r // world : len(batches) * (r + 1) // world] for r in range(world)]
    return [_consecutive_runs(share, max(batch, size // batch * batch)) for share in shares]


def _consecutive_runs(batches: list[list[int]], size: int) -> list[range]:
    runs: list[range] = []
    for b in batches:
        last = runs[-1] if runs else None
        if last is not None and b[0] == last.stop and len(last) + len(b) <= size:
            runs[-1] = range(last.start, b[-1] + 1)
        else:
            runs.append(range(b[0], b[-1] + 1))
    return runs


def gather_all(obj: object) -> list:
    """Every rank's `obj` (picklable), in rank order, on every rank; [obj] without a process group."""
    if not dist.is_initialized():
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
