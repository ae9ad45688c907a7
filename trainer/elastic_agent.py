"""torchrun's elastic agent, with an exit barrier that a stop signal can interrupt.

torchrun's agent, its workers done, waits up to 300 s in the "exit barrier" for the other
nodes' agents, inside one blocking store call: a SIGTERM (a Slurm time limit, a pod deletion)
is handled only when that call returns, so a node whose work had just finished when the job
was told to stop outlived the others by 5 minutes, past the time limit. Here the barrier
waits in short slices, and the signal ends it at once. ``python -m trainer.agent`` runs it.
"""

from __future__ import annotations

import time

from torch.distributed import DistError
from torch.distributed.elastic.agent.server import api as agent_api
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.utils import store as store_util

BARRIER_SLICE_S = 0.2  # how often the exit barrier looks at the store (and at signals)

log = agent_api.logger  # torchrun's own agent log, with its format


class Agent(LocalElasticAgent):
    """torchrun's agent, with an exit barrier that a stop signal can interrupt."""

    def _exit_barrier(self) -> None:
        # torch's own: one store.wait() of up to exit_barrier_timeout, deaf to signals
        group, store = self._worker_group, self._store
        if store is None or group.group_world_size is None:  # no rendezvous happened
            return super()._exit_barrier()
        log.info("local workers finished (%s): waiting up to %s s for the other nodes",
                 group.state, self._exit_barrier_timeout)
        self._in_exit_barrier = True
        try:
            last = store_util._barrier_nonblocking(  # the same keys as torch's barrier
                store=store, world_size=group.group_world_size,
                key_prefix=agent_api._TERMINAL_STATE_SYNC_ID)
            deadline = time.monotonic() + self._exit_barrier_timeout
            while not store.check([last]):
                if time.monotonic() > deadline:
                    log.warning("the other nodes did not finish within %s s: exiting anyway",
                                self._exit_barrier_timeout)
                    return
                time.sleep(BARRIER_SLICE_S)  # a signal's handler runs here
        except SignalException as exc:
            log.warning("%s while waiting for the other nodes: stopping", exc.sigval.name)
            raise
        except DistError as exc:
            # the agent that hosts the store leaves once the barrier is complete (or when it is
            # stopped): between two looks, this one can find the store gone
            log.info("the rendezvous store closed while waiting for the other nodes (%s): "
                     "done waiting", type(exc).__name__)
        except Exception as exc:  # as torch's barrier: log it and go on exiting
            log.warning("error while waiting for the other nodes at the end: %s", exc)
        finally:
            self._in_exit_barrier = False
