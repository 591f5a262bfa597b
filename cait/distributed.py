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
