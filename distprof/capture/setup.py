"""Where a rank's run goes and whom it syncs clocks with, settled once at a point every rank reaches.

The run id and the host roles need every rank (:func:`clock.agree`), so they are agreed only where every rank of the
job is guaranteed to be: when the default process group registers inside ``init_process_group`` (the capture's
listener in ``groups.py``), or when a profiler starts on a job whose group already exists. Never at a window
boundary: a rank there may be blocked on a peer (a pipeline stage waiting in ``recv``) that cannot get to the same
point. Without an agreement the run id still comes from ``--run-id`` / ``SLURM_JOB_ID`` / ``TORCHELASTIC_RUN_ID``
(the same on every rank), and a job of one process makes its own.
"""

from __future__ import annotations

import logging
import os
import threading
from datetime import timedelta
from pathlib import Path

from ..config import ProfileConfig
from ..storage.writer import remove_orphans
from . import clock, dist_info
from .sim import sim_clock, sim_host_index

log = logging.getLogger(__name__)


def env_run_id() -> str | None:
    for key in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        v = os.environ.get(key, "").strip()
        if v and v.lower() != "none":
            return v
    return None


def _env_world_size() -> int:
    for key in ("WORLD_SIZE", "SLURM_NTASKS"):
        try:
            return int(os.environ[key])
        except (KeyError, ValueError):
            continue
    return 1


def is_distributed() -> bool:
    """More than one rank: an initialized group of several, or a launcher that says so."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size() > 1
    return _env_world_size() > 1


class RunSetup:
    """The agreement (run id, roles, side channel) and the run directory, for one profiler. Thread-safe."""

    def __init__(self, config: ProfileConfig, clock_sync: clock.ClockSync) -> None:
        self.config = config
        self.clock = clock_sync
        self.agreement: clock.Agreement | None = None
        self.run_id: str | None = None
        self.run_dir: Path | None = None
        self._agreed = threading.Event()
        self._lock = threading.Lock()
        self._local_id: str | None = None

    # -- the agreement (a point every rank reaches; blocking) ------------------------------------------------------
    def agree(self, store, rank: int, world_size: int, timeout: timedelta | None = None) -> None:
        """Agree the run id and host roles with every rank, open the leaders' side channel, start clock sync.

        `timeout`: how long to wait for the other ranks (default: the store's own, what torch waits for peers).
        """
        if self.agreement is not None:
            return
        self.clock.sim = sim_clock(sim_host_index(rank))
        explicit = self.config.run_id or env_run_id()
        agreement = clock.agree(store, rank, world_size, dist_info.host_of(rank), explicit, timeout)
        channel = clock.open_side_channel(store, agreement, timedelta(seconds=self.config.sync_timeout_s))
        self.agreement = agreement
        self.clock.start(agreement.roles, channel)
        self._agreed.set()

    def agree_with_existing_group(self) -> bool:
        """The profiler starts on a job whose default group exists: agree now (every rank enters the profiler),
        waiting at most the sync timeout for the others."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return False
        from torch.distributed import distributed_c10d as c10d

        self.agree(c10d._get_default_store(), dist.get_rank(), dist.get_world_size(),
                   timedelta(seconds=self.config.sync_timeout_s))
        return True

    def roles(self) -> clock.ClockRoles | None:
        """Host roles: agreed, or this rank alone when the job is one process; None when not (yet) known."""
        if self.agreement is not None:
            return self.agreement.roles
        if not is_distributed():
            return clock.roles_of([dist_info.host_of(0)], 0)
        return None

    # -- the run directory ------------------------------------------------------------------------------------------
    def _run_id(self, gave_up: bool) -> str | None:
        if self.agreement is not None:
            return self.agreement.run_id
        explicit = self.config.run_id or env_run_id()
        if explicit:
            return explicit
        if is_distributed() and not gave_up:
            return None
        if is_distributed():
            log.warning("distprof: no run id agreed with the other ranks within %.0f s (the process group was made "
                        "where distprof could not see it); this rank writes to its own run directory; pass --run-id "
                        "to keep the ranks together", self.config.sync_timeout_s)
        self._local_id = self._local_id or clock.new_run_id()
        return self._local_id

    def ensure_run_dir(self, rank: int, *, wait: bool) -> Path | None:
        """The run directory (created, this rank's orphans removed) once the run id is known; None when not yet.

        `wait` (background threads only): wait for the agreement first, bounded by the sync timeout.
        """
        if self.run_dir is not None:
            return self.run_dir
        if wait and self.agreement is None and not (self.config.run_id or env_run_id()) and is_distributed():
            self._agreed.wait(self.config.sync_timeout_s)
        with self._lock:
            if self.run_dir is not None:
                return self.run_dir
            run_id = self._run_id(gave_up=wait)
            if run_id is None:
                return None
            run_dir = Path(self.config.out) / run_id
            run_dir.mkdir(parents=True, exist_ok=True)
            remove_orphans(run_dir, rank)
            self.run_id, self.run_dir = run_id, run_dir
            return run_dir
