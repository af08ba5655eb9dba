"""colltutor: every torch.distributed collective, built from send/recv.

The public functions have the names, parameters and in-place semantics of
``torch.distributed`` (replace ``dist.`` by ``colltutor.``), plus ``algorithm=``.
"""

from colltutor import clusters, cost, nccl_tuning, simulation, torch_backend, tracing
from colltutor.agreement import MismatchError, PeerArgumentError, set_checks
from colltutor.api import (
    all_gather,
    all_gather_coalesced,
    all_gather_into_tensor,
    all_gather_single,
    all_reduce,
    all_reduce_coalesced,
    all_to_all,
    all_to_all_single,
    barrier,
    broadcast,
    gather,
    irecv,
    isend,
    recv,
    reduce,
    reduce_scatter,
    reduce_scatter_single,
    reduce_scatter_tensor,
    scatter,
    send,
)
from colltutor.clusters import nccl_model, topologies
from colltutor.engine import Work, algorithms, synchronize, use
from colltutor.grader import check
from colltutor.ops import ReduceOp
from colltutor.p2p import PeerLostError
from colltutor.runtime import (
    RankError,
    RankTimeoutError,
    device,
    environment,
    init,
    launch,
    rank,
    run,
    shutdown,
    world_size,
)
from colltutor.simulation import simulate
from colltutor.tracing import record as trace

torch_backend.register()  # dist.init_process_group("colltutor") from here on

__all__ = [
    "MismatchError", "PeerArgumentError", "PeerLostError", "RankError",
    "RankTimeoutError", "ReduceOp", "Work", "algorithms", "all_gather",
    "all_gather_coalesced", "all_gather_into_tensor", "all_gather_single",
    "all_reduce", "all_reduce_coalesced", "all_to_all",
    "all_to_all_single", "barrier", "broadcast", "check", "clusters", "cost", "device",
    "environment", "gather", "init", "irecv", "isend", "launch", "nccl_model",
    "nccl_tuning",
    "rank", "recv",
    "reduce", "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor",
    "run", "scatter", "send", "set_checks", "shutdown", "simulate", "simulation",
    "synchronize", "topologies", "trace", "tracing", "use", "world_size",
]
