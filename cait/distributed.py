"""Data-parallel processes under torchrun, for training and for the commands that share images over
ranks: which rank this process is, how many there are, and on which device it runs."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from .runtime import resolve_device


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
