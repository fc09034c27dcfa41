"""Full logical tensors from the shards of the ranks (collective over the plan's ranks).

:func:`gather_logical` uses pipeline 0, which holds every parameter: per stage, the TP ranks
all-gather their shards (one flat buffer), the stage leader assembles the full tensors and either
broadcasts them over the plan's ranks or sends them to global rank 0.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from executor.parallel.groups import ProcessGroups
from planner.layout import stage_params


def gather_logical(groups: ProcessGroups, local: dict[str, torch.Tensor], *, to_all: bool) -> dict[str, torch.Tensor]:
    """Collective over the plan's ranks: full logical CPU tensors from every rank's shards
    (``local``: this rank's shard per name). ``to_all=False`` delivers to global rank 0 only."""
    topo = groups.topology
    rank = groups.rank
    model = topo.model
    out: dict[str, torch.Tensor] = {}
    device = next(iter(local.values())).device
    for st in topo.pipelines[0]:
        if st.cp_rank:  # CP slots of a stage hold the same shards: slot 0 gives them
            continue
        infos = stage_params(model, st.layers, st.is_first, st.is_last, st.chunks)
        total = sum(i.numel for i in infos)
        full: torch.Tensor | None = None
        if rank in st.ranks:
            shards = [local[i.name].detach().float().reshape(-1) for i in infos if i.shard_dim is not None]
            flat = torch.cat(shards)
            if st.tp > 1:
                parts = [torch.empty_like(flat) for _ in range(st.tp)]
                dist.all_gather(parts, flat, group=groups.group(st.ranks))
            else:
                parts = [flat]
            if rank == st.leader:
                tensors, off = [], 0
                for i in infos:
                    if i.shard_dim is None:
                        tensors.append(local[i.name].detach().float().reshape(-1))
                        continue
                    shape = list(i.shape)
                    shape[i.shard_dim] //= st.tp
                    n = i.numel // st.tp
                    pieces = [p[off:off + n].view(shape) for p in parts]
                    tensors.append(torch.cat(pieces, dim=i.shard_dim).reshape(-1))
                    off += n
                full = torch.cat(tensors)
        if to_all:
            if full is None:
                full = torch.empty(total, dtype=torch.float32, device=device)
            if topo.world_size > 1:
                dist.broadcast(full, src=st.leader, group=groups.world)
        elif st.leader != 0:
            if rank == st.leader:
                assert full is not None
                dist.send(full, dst=0)
            elif rank == 0:
                full = torch.empty(total, dtype=torch.float32, device=device)
                dist.recv(full, src=st.leader)
        if full is not None:
            flat_cpu = full.cpu()
            off = 0
            for i in infos:
                out[i.name] = flat_cpu[off:off + i.numel].view(i.shape).clone()
                off += i.numel
    return out
