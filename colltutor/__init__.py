"""colltutor: every torch.distributed collective, built from send/recv."""

from colltutor.runtime import RankError, RankTimeoutError, rank, run, world_size

__all__ = ["run", "rank", "world_size", "RankError", "RankTimeoutError"]
