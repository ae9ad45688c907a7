#!/bin/bash
# torchjob: @name@ on Slurm. Create the run directory first (Slurm does not):
#   mkdir -p @run_dir@ && sbatch THIS
@directives@

set -euo pipefail
# Stopping: exit code 143 means "stopped: a checkpoint was written, run again to continue".
# --signal=B:USR2@N sends USR2 to this batch shell only (the time limit is near: requeue);
# `torchjob cancel` sends USR1 (stop for good). A signal sent to a job step reaches EVERY
# process of the step (agent and workers alike), so a step-wide USR2 or TERM would hit each
# worker twice: once from Slurm, once forwarded by torchrun's agent, and the trainer treats a
# second stop signal as "exit now, without a checkpoint". Instead this shell sends the step
# SIGURG once, which every process ignores by default except the per-node wrapper below; the
# wrapper sends TERM to its agent alone, the agent forwards it once to its workers, they
# finish the step, checkpoint and exit 143, and this shell requeues the job after a USR2
# (bounded by slurm.max_requeues). A requeue or preemption by Slurm itself sends TERM to every
# process at once: each worker takes it and the agent's copy a moment later for one stop and
# checkpoints where it is, unless Slurm's kill (KillWait later, or the partition's GraceTime)
# comes first; then the run resumes from the last periodic one. The traps are set first thing,
# so that no stop is lost: one before the step starts means no step; one before a node's
# wrapper set its own trap, the .stop file.
stop=0 pending=0 cancelled=0
# shellcheck disable=SC2317  # called from the traps below
stop_step() {
  pending=1
  echo "torchjob: $1: asking the training step to checkpoint and stop"
  if [ "$stop" = 0 ]; then
    stop=1
    # before the URG: a node wrapper that sets its URG trap too late for it sees this file
    if [ -d "${TORCHJOB_NODE_STATUS:-}" ]; then : > "$TORCHJOB_NODE_STATUS/.stop"; fi
    scancel --signal=URG "$SLURM_JOB_ID" || true
  fi
}
trap 'stop_step USR2' USR2
trap 'cancelled=1; stop_step "USR1 (torchjob cancel)"' USR1

# this job's values (from the job spec); the rest of the script is the same for every job
name=@name@
nnodes=@nnodes@ min_nodes=@min_nodes@ elastic=@elastic@
join_timeout=@join_timeout@ max_restarts=@max_restarts@ max_requeues=@max_requeues@
cd @workdir@
@exports@

# rendezvous: the first node of the allocation, on a port derived from the job id
# (torchjob.trainer.env.slurm_port: 12000 + id % 20000, so two jobs on a node do not collide)
# (no "| head -n1": with pipefail, scontrol dying of SIGPIPE would end the script)
hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST")
rdzv_host=${hosts%%$'\n'*}
port=$((12000 + SLURM_JOB_ID % 20000))
wanted=$port
# unless something there listens on it already (a service of the node, such as a slurmd):
# the store could not bind it, and the agents would talk to that service instead; then the
# next port of 12000..31999 where nothing answers (a refused or unanswered connection: free)
taken=0
# shellcheck disable=SC2016  # $0 and $1 are the inner shell's: the host and the port
while [ "$taken" -lt 100 ] && timeout 2 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$rdzv_host" "$port" 2>/dev/null; do
  taken=$((taken + 1)); port=$(( (port - 12000 + 1) % 20000 + 12000 ))
done
if [ "$taken" -gt 0 ]; then echo "torchjob: $taken port(s) from $wanted on $rdzv_host were in use: the rendezvous is on port $port" >&2; fi
attempt=${SLURM_RESTART_COUNT:-0}
job=$SLURM_JOB_ID
if [ -n "${SLURM_ARRAY_JOB_ID:-}" ]; then job=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}; fi
# each worker's lines carry "[node N rank R attempt A] " (the agent's --tee with the one line
# prefix; A counts from this attempt), so that `torchjob logs` can show them per attempt and rank
export TORCHJOB_ATTEMPT_BASE=$attempt
# each node's wrapper writes its exit code here (on the shared file system)
export TORCHJOB_NODE_STATUS=@node_status@/"$SLURM_JOB_ID.$attempt"
header="torchjob: $name job $job attempt $attempt on $SLURM_JOB_NUM_NODES node(s), rendezvous $rdzv_host:$port"
echo "$header"; echo "$header" >&2  # where this attempt starts, in both logs
@point@

# Slurm requeues a job by itself too (preemption, `scontrol requeue`): slurm.max_requeues
# bounds every requeue, not only this script's own
if [ "$attempt" -gt "$max_requeues" ]; then
  echo "torchjob: attempt $attempt: the job was requeued more often than slurm.max_requeues=$max_requeues allows; not run again: its checkpoint is in place, submit the script again to continue" >&2
  exit 143
fi
mkdir -p "$TORCHJOB_NODE_STATUS"
store=""
@store@


# one task per node: this wrapper around the agent (a constant; it takes the agent's command as "$@")
read -r -d '' node <<'NODE' || true
"$@" & agent=$!
stopping=0 pending=0
trap 'stopping=1 pending=1; kill -TERM "$agent" 2>/dev/null || true' URG
if [ -e "$TORCHJOB_NODE_STATUS/.stop" ]; then stopping=1; kill -TERM "$agent" 2>/dev/null || true; fi
code=0; wait "$agent" || code=$?
while [ "$code" -gt 128 ] && [ "$pending" = 1 ]; do  # the URG trap cut wait short
  pending=0; next=0; wait "$agent" || next=$?
  [ "$next" = 127 ] || code=$next  # 127: the agent had already been collected
done
# torchrun's agent exits 1 after a forwarded stop; its workers exited 143 after a checkpoint
if [ "$stopping" = 1 ] && [ "$code" != 0 ]; then code=143; fi
# report how this node ended; a node that never reports was lost (killed, or the node failed)
echo "$code" > "$TORCHJOB_NODE_STATUS/${SLURMD_NODENAME:-$(hostname)}" 2>/dev/null || true
exit "$code"
NODE
code=143  # stopped before the step started: nothing to run, the checkpoint is as it was
if [ "$stop" = 0 ]; then
  srun @srun_options@ bash -c "$node" torchjob-node @agent@ &
  step=$!
  code=0; wait "$step" || code=$?
  while [ "$code" -gt 128 ] && [ "$pending" = 1 ]; do  # a trap cut wait short
    pending=0; next=0; wait "$step" || next=$?
    [ "$next" = 127 ] || code=$next  # 127: the step had already been collected
  done
fi
if [ -n "$store" ]; then kill -TERM "$store" 2>/dev/null || true; wait "$store" || true; fi

# a failed step: which nodes never reported how their agent ended (lost: killed, or the node failed)?
if [ "$code" != 0 ] && [ "$stop" = 0 ]; then
  lost="" finished=0
  for host in $hosts; do
    if [ ! -f "$TORCHJOB_NODE_STATUS/$host" ]; then lost="$lost $host"
    elif [ "$(cat "$TORCHJOB_NODE_STATUS/$host")" = 0 ]; then finished=$((finished + 1)); fi
  done
  if [ -n "$lost" ]; then
    echo "torchjob: lost node(s):$lost: the task there ended without reporting (killed, or the node failed); step exit $code" >&2
    if [ "$elastic" = 0 ]; then
      echo "torchjob: nnodes is $nnodes (fixed): the job cannot continue without every node, so it failed (the other agents gave up after rdzv.join_timeout=${join_timeout}s or max_restarts=$max_restarts). Submit again to resume from the last checkpoint, or use nnodes MIN:MAX to carry on with fewer nodes" >&2
    elif [ "$finished" -ge "$min_nodes" ]; then  # as every backend: torchjob.trainer.contract.nodes_exit_code
      echo "torchjob: the job continued without them at a smaller size (nnodes $nnodes: at least $min_nodes) and finished on $finished node(s)"
      code=0
    else
      echo "torchjob: the remaining node(s) did not finish either: failed" >&2
    fi
  fi
fi
# read; the next attempt writes its own
rm -rf "$TORCHJOB_NODE_STATUS"; rmdir "${TORCHJOB_NODE_STATUS%/*}" 2>/dev/null || true

# 0: done; 143: stopped after a checkpoint (requeued after a USR2); anything else: a failure
if [ "$stop" = 0 ] || [ "$code" != 143 ]; then exit "$code"; fi
if [ "$cancelled" = 1 ]; then
  echo "torchjob: stopped by torchjob cancel after a checkpoint; submit the script again to continue" >&2
  exit 143
fi
if [ "$attempt" -lt "$max_requeues" ]; then
  echo "torchjob: stopped (step exit $code); requeueing, attempt $((attempt + 1)) of $max_requeues requeues"
  scontrol requeue "$SLURM_JOB_ID" || echo "torchjob: scontrol requeue failed: submit the script again to continue" >&2
  exit 143  # Slurm ends this attempt; the requeued one resumes from the checkpoint
fi
echo "torchjob: stopped after $max_requeues requeues (slurm.max_requeues): the checkpoint is in place; submit the script again to continue" >&2
exit 143
