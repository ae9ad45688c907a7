"""torchrun's elastic agent, with an exit barrier that a stop signal can interrupt, a watch on
its own membership of the rendezvous (trainer.membership), the hang watchdog (trainer.hang)
in its monitor loop, and the one log prefix (node, rank, attempt) on its workers' lines.
``python -m torchjob.trainer.agent`` runs it; why each: docs/internals.md.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import signal
import sys
import time
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

from torch.distributed import DistError
from torch.distributed.elastic.agent.server import api as agent_api
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import api as mp_api
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
from torch.distributed.elastic.utils import store as store_util

from torchjob.trainer import ledger, stop_heard
from torchjob.trainer.contract import (CHECKPOINT_DIR_ENV, FINISHED, HANG_ACTION, HANG_LINE,
                                       HEARD_RESTART, MAX_STALLED_DEFAULT, RUN_DIR_ENV,
                                       attempt_base, log_prefix)
from torchjob.trainer.failures import (RESTARTING, Failure, Verdict, exception_line, judge,
                                       within)
from torchjob.trainer.culprit import Finding, ranks
from torchjob.trainer.error_files import despite_unreadable
from torchjob.trainer.hang import Looked, Seen, Watchdog, stuck_line
from torchjob.trainer.stacks import half_started, kill, kill_deaf
from torchjob.trainer.membership import MembershipWatch, watched
from torchjob.trainer.pace import Pace
from torchjob.trainer.round_verdict import LOOK_S, VERDICT_WAIT_S, RoundVerdict, cause

BARRIER_SLICE_S = 0.2  # how often the exit barrier looks at the store (and at signals)
# A finished job's nodes leave together (``_leave_together``): each says so, the last one
# releases every node's wait. The store's host must not close it while another node still
# talks to it: that node's client prints C++ stack traces (a clean finish must be quiet).
LEFT_KEY, ALL_LEFT_KEY = "torchjob.left", "torchjob.all_left"
LEAVE_WAIT_S = 5.0

log = agent_api.logger  # torchrun's own agent log, with its format


class NoWorkerTraceback(logging.Filter):
    """Drops the traceback of torch's "failed (exitcode: N) local_rank: R" error: it is the
    agent's own ``ProcessExitedException`` (a worker ended with exit N), which says nothing
    that line does not; the worker's own traceback is in its log above. It also keeps the
    restart fast: torch's log formatter imports ``torch._dynamo`` (seconds) to format any
    traceback, the first time one is logged, and that was on every first restart's path."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and type(record.exc_info[1]).__name__ in (
                "ProcessExitedException", "ProcessRaisedException"):
            record.exc_info, record.exc_text = None, None
        return True


mp_api.logger.addFilter(NoWorkerTraceback())


class Agent(LocalElasticAgent):
    """torchrun's agent, with an exit barrier that a stop signal can interrupt, a watch on
    its node's membership of the rendezvous, the one log prefix on its workers' lines, and
    restarts only for lost workers (torchjob.trainer.failures), decided alike on every node."""

    # how the run went, for its exit code (torchjob.trainer.agent's ``ended``)
    closing: tuple[str, int] | None = None  # why the job failed, and the attempt
    # whether this node met the others at the rendezvous store (a store lost after that is
    # EXIT_STORE_LOST, retried; one never reached is a failure), and whether it lost it
    met = False
    store_lost = False
    started: int | None = None  # the attempt this node's workers last started

    def __init__(self, spec: agent_api.WorkerSpec, *args: Any, retry_on_error: bool = False,
                 max_stalled_restarts: int = MAX_STALLED_DEFAULT, hang_timeout: float = 0.0,
                 progress_dir: str | None = None, **kwargs: Any) -> None:
        """torch's arguments, and ours: restart on user exceptions too, the restart storm
        guard (torchjob.trainer.ledger), the hang watchdog's timeout (0: none) and the folder
        its workers report progress in (torchjob.trainer.progress)."""
        spec.rdzv_handler = watched(spec)  # type: ignore[assignment]
        super().__init__(spec, *args, **kwargs)
        self.retry_on_error, self.max_stalled_restarts = retry_on_error, max_stalled_restarts
        self._attempt_base = attempt_base(os.environ)
        # the run's ledger (torchjob.trainer.ledger), in the run directory: none without one
        self._run_dir = os.environ.get(RUN_DIR_ENV) or None
        self._checkpoint_dir = os.environ.get(CHECKPOINT_DIR_ENV) or None
        self._run_id = spec.rdzv_handler.get_run_id()
        self._watchdog = None if not (hang_timeout and progress_dir) else Watchdog(
            Path(progress_dir), hang_timeout, others_first_s=VERDICT_WAIT_S,
            say=lambda line: log.warning("%s", line))
        # node 0's count: RUN_DIR/progress.json, and its log for a script (the built-in
        # trainer, a function here, prints its own progress lines: torchjob.trainer.pace)
        self._pace = Pace(self._run_dir, say=None if callable(spec.entrypoint)
                          else lambda line: log.warning("%s", line))
        self._looked: Looked | None = None  # what _look_before_close found
        self._other_failed: str | None = None  # why, when another node failed the job after
        # this one's workers finished (_exit_barrier)
        self._look_at = 0.0  # when _heard looks for another node's failure next

    def run(self, role: str = agent_api.DEFAULT_ROLE) -> agent_api.RunResult:
        started = time.time()
        result = super().run(role)  # (its _shutdown also stops the workers for a restart)
        self._leave_together()
        self._tell_pace()
        self._summarize(result, started)
        return result

    def _tell_pace(self) -> None:
        """Node 0's last count of its workers, which have ended (``Pace.tell``)."""
        dog = self._watchdog
        if dog is not None and not self._worker_group.group_rank:
            self._pace.tell(dog.seen, self.attempt(), dog.observe(force=True), last=True)

    def _summarize(self, result: agent_api.RunResult, started: float) -> None:
        """``summary.json`` from node 0 when the workers wrote none in this run (a script, a
        failed run): how it ended, its restarts, changes of membership and hangs."""
        if self._run_dir is not None and (self._worker_group.group_rank or 0) == 0:
            failure = Agent.closing[0] if Agent.closing else self._other_failed
            state = "FAILED" if self._other_failed else result.state.name
            ledger.summarize(self._run_dir, self._run_id, started, state=state,
                             attempt=self.attempt(), failure=failure)

    def _monitor_workers(self, worker_group: agent_api.WorkerGroup) -> agent_api.RunResult:
        stop_heard.raise_if_heard()  # a stop whose exception was lost (trainer.stop_heard)
        result = despite_unreadable(partial(super()._monitor_workers, worker_group),
                                    lambda: self._pcontext)
        result, hung = self._watch(worker_group, result)
        if result.state == agent_api.WorkerState.HEALTHY and (told := self._heard(worker_group)):
            return told
        if result.state == agent_api.WorkerState.SUCCEEDED and \
                (shared := self._round()) is not None and (heard := shared.finish()):
            log.warning("torchjob: this node's workers finished, but %s", heard.why)
            return agent_api.RunResult(state=agent_api.WorkerState.UNHEALTHY)  # restart too
        if result.state in {agent_api.WorkerState.FAILED, agent_api.WorkerState.UNHEALTHY}:
            node = worker_group.group_rank or 0
            failures = [Failure(node, rank, f.exitcode, exception_line(f.message),
                                f.timestamp, hung.get(rank, ""))
                        for rank, f in result.failures.items()]
            left, limit = self._remaining_restarts, worker_group.spec.max_restarts
            verdict = within(judge(failures, retry_on_error=self.retry_on_error), left, limit)
            mark = ledger.checkpoint_mark(self._checkpoint_dir)
            if verdict.restart:
                verdict = self._storm(verdict, mark)
            verdict = within(self._shared(verdict), left, limit)  # a lost peer's, a heard one
            log.warning("torchjob: %s", verdict.why)
            if verdict.restart and not verdict.why.startswith(HEARD_RESTART):
                self._note("restart", verdict, mark)  # the node that told the others writes
            if not verdict.restart:
                Agent.closing = (verdict.why, self.attempt())
                self._remaining_restarts = 0  # torch's loop then stops the group and returns
        return result

    def _heard(self, group: agent_api.WorkerGroup) -> agent_api.RunResult | None:
        """While the workers run, every LOOK_S: their end, once another node failed the job."""
        if time.monotonic() < self._look_at or (shared := self._round()) is None:
            return None
        self._look_at = time.monotonic() + LOOK_S
        if (verdict := shared.heard()) is None:
            return None
        log.warning("torchjob: %s", verdict.why)
        Agent.closing, self._remaining_restarts = (verdict.why, self.attempt()), 0
        return agent_api.RunResult(state=agent_api.WorkerState.FAILED, failures={
            w.global_rank: ProcessFailure(local_rank=w.local_rank, pid=w.id or 0,
                                          exitcode=-signal.SIGTERM, error_file="")
            for w in group.workers})

    def _storm(self, verdict: Verdict, mark: str | None) -> Verdict:
        """``verdict`` (a restart), or a failure when the restarts before it already came
        back to checkpoint ``mark`` ``max_stalled_restarts`` times (torchjob.trainer.ledger)."""
        if self._run_dir is None or self.max_stalled_restarts <= 0:
            return verdict
        stalled = ledger.stalled(ledger.read(self._run_dir), self._run_id, mark)
        if len(stalled) < self.max_stalled_restarts:
            return verdict
        why = ledger.storm_line(stalled, mark)
        ledger.append(self._run_dir, "storm", run=self._run_id, checkpoint=mark,
                      restarts=len(stalled), cause=cause(verdict))
        return Verdict(False, verdict.cause, f"{cause(verdict)}: {why}")

    def _note(self, event: str, verdict: Verdict, mark: str | None, **extra: Any) -> None:
        """A restart's line in the ledger: where and how the workers failed, and what the next
        attempt resumes from."""
        if self._run_dir is None:
            return
        watch = self._rdzv_watch()
        cause = verdict.cause
        name = watch.this_node() if watch else ledger.node_name()
        ledger.append(self._run_dir, event, run=self._run_id, round=watch.round if watch else None,
                      node=f"{self._worker_group.group_rank} ({name})",
                      rank=cause.rank if cause else None,
                      **(ledger.exit_fields(cause.exitcode) if cause else {}),
                      cause=verdict.why.removesuffix(RESTARTING), attempt=self.attempt(),
                      step=self._step_reached(), checkpoint=mark, **extra)

    def _step_reached(self) -> int | None:
        """The highest step this node's workers reported (torchjob.trainer.progress), if any did."""
        seen = self._watchdog.seen if self._watchdog else []
        steps = [w.step if w.step >= 0 else w.record.optimizer_steps if w.record else 0
                 for w in seen]
        steps = [s for s in steps if s > 0]
        return max(steps) if steps else None

    def _rdzv_watch(self) -> MembershipWatch | None:
        handler = self._worker_group.spec.rdzv_handler
        return handler if isinstance(handler, MembershipWatch) else None

    def _watch(self, group: agent_api.WorkerGroup, result: agent_api.RunResult,
               ) -> tuple[agent_api.RunResult, dict[int, str]]:
        """The hang watchdog's turn (torchjob.trainer.hang): ``result``, or a failure of the stuck
        workers once this node acts on a hang; and why each rank it killed was stuck."""
        dog = self._watchdog
        if dog is None or not dog.seen:
            return result, {}
        node = group.group_rank or 0
        now = dog.clock()
        if result.state in {agent_api.WorkerState.FAILED, agent_api.WorkerState.UNHEALTHY}:
            # another failure came first (a peer's): the rank it waited for, or a stopped one
            # here, is still the cause; looked for before torch stopped them (_look_before_close)
            looked, self._looked = self._looked, None
            if looked is None:
                return result, {}
            if looked.hang is not None:
                log.warning("%s%s: %s%s, to restart them from the last checkpoint; stacks in %s",
                            HANG_LINE, node, looked.hang.finding.why, HANG_ACTION, looked.where)
                self._note_hang(looked.hang.finding, node)
            else:
                log.warning("torchjob: stuck on node %s: %s; killed; stacks in %s", node, "; ".join(
                    f"rank {r} ({t})" for r, t in looked.named.items()), looked.where)
            result.failures.update({w.rank: self._killed(w) for w in looked.stuck})
            return result, looked.named
        elif result.state == agent_api.WorkerState.HEALTHY:
            hang = dog.poll()  # reads the workers' files, at most every READ_EVERY_S
            if node == 0:
                self._pace.tell(dog.seen, self.attempt(), now)
            if dog.first_dump():
                log.warning("torchjob: node %s near its hang_timeout (%g s) without progress: "
                            "stacks of its ranks in %s", node, dog.timeout,
                            dog.dump(self._hangs(), node, dog.seen))
            if hang is None:
                return result, {}
            stuck = list(hang.stuck)
            log.warning("%s%s: %s%s, to restart them from the last checkpoint", HANG_LINE, node,
                        hang.finding.why, HANG_ACTION)
            self._note_hang(hang.finding, node)
            kill(w.pid for w in dog.seen)  # the whole group: no SIGTERM would be heard
            result = agent_api.RunResult(state=agent_api.WorkerState.FAILED)
            named = {w.rank: stuck_line(w, hang.finding, now, node) for w in stuck}
        else:
            return result, {}
        kill(w.pid for w in stuck)
        result.failures.update({w.rank: self._killed(w) for w in stuck})
        return result, named

    def _note_hang(self, finding: Finding, node: int) -> None:
        """The hang in the ledger, once: from the node of its first culprit (node 0 when none
        was told apart)."""
        first = finding.culprits[0].node if finding.culprits else 0
        if self._run_dir is None or node != first:
            return
        ledger.append(self._run_dir, "hang", run=self._run_id, attempt=self.attempt(),
                      culprits=[{"rank": v.rank, "node": v.node, "how": v.how(),
                                 "frame": v.frame} for v in finding.culprits[:8]],
                      waiting=ranks(finding.waiting), why=finding.why[:1500])

    @staticmethod
    def _killed(worker: Seen) -> ProcessFailure:
        """What torch records for a worker the watchdog killed (exit by SIGKILL)."""
        return ProcessFailure(local_rank=worker.local_rank, pid=worker.pid,
                              exitcode=-signal.SIGKILL, error_file="")

    def _hangs(self) -> Path | None:
        """Where this attempt's stacks go: ``RUN_DIR/hangs/attempt<A>`` (None: the log)."""
        return Path(self._run_dir, "hangs", f"attempt{self.attempt()}") if self._run_dir \
            else None

    def _shutdown(self, *args: Any, **kwargs: Any) -> None:
        # torch sends SIGTERM and waits up to 30 s: one deaf to it would take all of it
        if self._pcontext is not None:
            kill_deaf(self._pcontext.pids().values())
        # and a worker stuck in init_process_group would take it too (its peers stopped)
        dog = self._watchdog if self._pcontext is not None else None
        with dog.ending_stuck_in_init() if dog is not None else nullcontext():
            super()._shutdown(*args, **kwargs)

    def _leave_together(self) -> None:
        """After the job's last use of the store (it finished, or a node failed it), wait (up
        to ``LEAVE_WAIT_S``) until every node is done with it: the node that hosts it leaves
        only then. One blocking wait, which the store answers to every node at once; the last
        node to come only says so (the host may leave on that)."""
        group, store = self._worker_group, self._store
        nodes = group.group_world_size or 1
        ended = (agent_api.WorkerState.SUCCEEDED, agent_api.WorkerState.FAILED)
        if store is None or nodes == 1 or Agent.store_lost or group.state not in ended:
            return  # (a node that heard another fail the job after its own finished: SUCCEEDED)
        # the rendezvous' close is each node's last use of the store: here, before the node
        # hosting it may leave (torch closes it after the agent's run, which a node without
        # the store did against a closed one: "failed to shutdown the rendezvous" and a
        # stack trace); torch's own call then does nothing (MembershipWatch.shutdown)
        try:
            group.spec.rdzv_handler.shutdown()
            if store.add(LEFT_KEY, 1) >= nodes:
                store.set(ALL_LEFT_KEY, "1")
            else:
                store.wait([ALL_LEFT_KEY], datetime.timedelta(seconds=LEAVE_WAIT_S))
        except Exception as exc:  # a node that never came, or the store already gone
            log.info("leaving without the other nodes: %s", type(exc).__name__)

    def _round(self) -> RoundVerdict | None:
        """The verdict of this round, shared through its store; None alone (nothing to share)."""
        group, store = self._worker_group, self._store
        nodes = group.group_world_size or 1
        return None if store is None or nodes == 1 else \
            RoundVerdict(store, nodes, group.group_rank or 0)

    def _shared(self, verdict: Verdict) -> Verdict:
        """The verdict every node of the round acts on (torchjob.trainer.round_verdict)."""
        if (shared := self._round()) is None:
            return verdict if verdict.restart is not None else \
                Verdict(True, verdict.cause, f"{cause(verdict)}{RESTARTING}")
        verdict = shared.share(verdict)
        Agent.store_lost = Agent.store_lost or shared.store_lost
        return verdict

    def attempt(self) -> int:
        """The attempt the workers started next run: the scheduler's base plus the restarts."""
        spec = self._worker_group.spec
        return self._attempt_base + spec.max_restarts - self._remaining_restarts

    def _start_workers(self, worker_group: agent_api.WorkerGroup) -> dict[int, Any]:
        # torch substitutes ${rank} (and ${local_rank}, ${role_name}) per worker
        node = worker_group.group_rank  # set by the rendezvous that precedes every start
        Agent.met, Agent.started = True, self.attempt()
        self._log_line_prefix_template = log_prefix("?" if node is None else node, "${rank}",
                                                    self.attempt())
        watch = self._rdzv_watch()
        if node == 0 and self._run_dir is not None and watch is not None:
            nodes = watch.nodes()  # the round's members, written once, by its node 0
            ledger.append(self._run_dir, "round", run=self._run_id, round=watch.round,
                          nodes=nodes if nodes is not None else worker_group.group_world_size,
                          world_size=worker_group.spec.local_world_size
                          * (worker_group.group_world_size or 1), attempt=self.attempt(),
                          checkpoint=ledger.checkpoint_mark(self._checkpoint_dir))
        if self._watchdog is not None:
            self._watchdog.clear()
        try:
            stop_heard.raise_if_heard()
            pids = super()._start_workers(worker_group)
        except SignalException:  # in no context of torch's yet, one held the exit for 300 s
            kill(half_started(os.getpid()))
            raise
        finally:
            stop_heard.remember()  # torch's handlers, installed as it started the workers
        if self._watchdog is not None:
            self._watchdog.reset(((w.local_rank, w.global_rank, pids[w.local_rank])
                                  for w in worker_group.workers), node=node or 0,
                                 nodes=worker_group.group_world_size or 1, store=self._store)
            self._look_before_close(node or 0)
        return pids

    def _look_before_close(self, node: int) -> None:
        """torch stops the rest of the group (SIGTERM) when a worker fails, before this agent
        hears of it: look at them first (Watchdog.look_at_failure; ``_watch`` names whom it
        found), then end the stopped ones at once (torch would wait 30 s for each)."""
        pcontext, dog = self._pcontext, self._watchdog
        if pcontext is None or dog is None:
            return
        close = pcontext.close

        def look_then_close(*args: Any, **kwargs: Any) -> None:
            try:
                if failed := getattr(pcontext, "_failures", {}):  # by local rank
                    self._looked = self._looked or dog.look_at_failure(failed, node, self._hangs())
            except Exception as exc:  # never in the way of stopping the group
                log.warning("torchjob: could not look at the workers left (%s)", exc)
            kill_deaf(pcontext.pids().values())
            close(*args, **kwargs)

        pcontext.close = look_then_close  # type: ignore[method-assign]

    def _restart_workers(self, worker_group: agent_api.WorkerGroup) -> None:
        if worker_group.state == agent_api.WorkerState.HEALTHY and worker_group.group_rank == 0:
            # torch restarts healthy workers for a change of membership (a node waits to join)
            self._note("restart", Verdict(True, None, "a change of membership: a node is "
                                          "waiting to join (or was dropped)"),
                       ledger.checkpoint_mark(self._checkpoint_dir), membership=True)
        super()._restart_workers(worker_group)

    def _say_finished(self) -> None:
        """How the job ended, from node 0 (``torchjob.trainer.contract.FINISHED``): the attempt, the
        size, the restarts and every change of membership of this run (torchjob.trainer.ledger)."""
        group = self._worker_group
        if group.state == agent_api.WorkerState.SUCCEEDED and group.group_rank == 0:
            nodes = group.group_world_size or 1
            line = (f"{FINISHED}attempt {self.attempt()}, {nodes} node(s), world size "
                    f"{group.spec.local_world_size * nodes}")
            print(ledger.finished(line, self._run_dir, self._run_id), file=sys.stderr, flush=True)

    def _exit_barrier(self) -> None:
        # torch's own: one store.wait() of up to exit_barrier_timeout, deaf to signals
        self._tell_pace()  # before the job's last line (_say_finished)
        group, store = self._worker_group, self._store
        if store is None or group.group_world_size is None:  # no rendezvous happened
            return super()._exit_barrier()
        log.info("local workers finished (%s): waiting up to %s s for the other nodes",
                 group.state, self._exit_barrier_timeout)
        shared = self._round()  # None alone: nobody else to fail the job
        self._in_exit_barrier = True
        try:
            last = store_util._barrier_nonblocking(  # the same keys as torch's barrier
                store=store, world_size=group.group_world_size,
                key_prefix=agent_api._TERMINAL_STATE_SYNC_ID)
            deadline = time.monotonic() + self._exit_barrier_timeout
            while not store.check([last]):
                # another node failed the job: the others will not come
                if shared is not None and (why := shared.failed()) is not None:
                    log.warning("torchjob: this node's workers finished, but another node "
                                "failed the job: %s", why)
                    self._other_failed = why  # (the rendezvous closes in _leave_together)
                    shared.read()
                    return
                if time.monotonic() > deadline:
                    log.warning("the other nodes did not finish within %s s: exiting anyway",
                                self._exit_barrier_timeout)
                    return
                time.sleep(BARRIER_SLICE_S)  # a signal's handler runs here
            self._say_finished()
        except SignalException as exc:
            log.warning("%s while waiting for the other nodes: stopping", exc.sigval.name)
            raise
        except DistError as exc:
            # the agent that hosts the store leaves once the barrier is complete (or when it is
            # stopped): between two looks, this one can find the store gone
            log.info("the rendezvous store closed while waiting for the other nodes (%s): "
                     "done waiting", type(exc).__name__)
            self._say_finished()
        except Exception as exc:  # as torch's barrier: log it and go on exiting
            log.warning("error while waiting for the other nodes at the end: %s", exc)
        finally:
            self._in_exit_barrier = False
