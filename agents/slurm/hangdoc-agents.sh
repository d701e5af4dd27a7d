#!/usr/bin/env bash
# Start (or stop) one hangdoc agent per node of the current Slurm allocation, as the job's
# user, next to the job's own steps (srun --overlap). Run it from inside the allocation:
# the batch script, an salloc shell, or `srun --jobid=JOBID --overlap --pty bash`.
#
#   agents/slurm/hangdoc-agents.sh start   # agents up, hostfile + token written, returns
#   hangdoc diagnose "$MASTER_ADDR:$MASTER_PORT" --hostfile "$HANGDOC_DIR/nodes.txt" \
#       --token-file "$HANGDOC_DIR/token"
#   agents/slurm/hangdoc-agents.sh stop
#
# The agents run as you, so the kernel must let you ptrace your own processes on the
# compute nodes: kernel.yama.ptrace_scope=0 (RHEL's default; Ubuntu's is 1). Otherwise use
# the root agent of agents/systemd or the prolog variant in this directory.
set -euo pipefail

# ---- variables --------------------------------------------------------------------------
# hangdoc on the compute nodes (a shared virtualenv; py-spy is found next to it).
HANGDOC=${HANGDOC:-hangdoc}
# Per-job directory on a file system the submit host can read (token, hostfile, logs).
HANGDOC_DIR=${HANGDOC_DIR:-$HOME/.hangdoc/slurm-${SLURM_JOB_ID:?run this inside a Slurm allocation}}
# One port per job so that several jobs (and a node-wide agent on 7420) can share a node.
HANGDOC_PORT=${HANGDOC_PORT:-$((17420 + SLURM_JOB_ID % 1000))}
# -----------------------------------------------------------------------------------------

start() {
    mkdir -p "$HANGDOC_DIR"
    chmod 0700 "$HANGDOC_DIR"
    if [[ ! -s $HANGDOC_DIR/token ]]; then
        (umask 077 && openssl rand -hex 32 > "$HANGDOC_DIR/token")
    fi
    scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s/\$/:$HANGDOC_PORT/" \
        > "$HANGDOC_DIR/nodes.txt"

    # One task per node sharing the job's resources, alive until stopped. The agent drops
    # the task's rank variables so that `slurm:JOBID` never takes it for a rank.
    srun --overlap --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --ntasks="$SLURM_JOB_NUM_NODES" \
        --cpus-per-task=1 --mem=0 --kill-on-bad-exit=0 --job-name=hangdoc-agent \
        --output="$HANGDOC_DIR/agent-%N.log" \
        env -u SLURM_PROCID -u SLURM_LOCALID -u PMI_RANK -u PMIX_RANK \
        "$HANGDOC" agent --listen "0.0.0.0:$HANGDOC_PORT" --token-file "$HANGDOC_DIR/token" &
    echo $! > "$HANGDOC_DIR/srun.pid"

    if ! wait_for_agents; then
        stop
        return 1
    fi
    echo "hangdoc agents started; nodes listed in $HANGDOC_DIR/nodes.txt ($(wc -l < "$HANGDOC_DIR/nodes.txt")), port $HANGDOC_PORT"
    echo "  hangdoc diagnose MASTER_ADDR:MASTER_PORT --hostfile $HANGDOC_DIR/nodes.txt --token-file $HANGDOC_DIR/token"
}

# Wait up to 60 s until every agent accepts TCP connections.
wait_for_agents() {
    local deadline=$((SECONDS + 60)) entry
    while read -r entry; do
        until timeout 1 bash -c ">/dev/tcp/${entry%:*}/${entry##*:}" 2>/dev/null; do
            if ((SECONDS >= deadline)); then
                echo "agent $entry did not come up; see $HANGDOC_DIR/agent-*.log" >&2
                return 1
            fi
            sleep 1
        done
    done < "$HANGDOC_DIR/nodes.txt"
}

# SIGTERM reaches every agent, which exits cleanly on it. Works from any shell of the job:
# through the srun started here when it runs on this host, else through the step's id.
stop() {
    local pid step
    pid=$(cat "$HANGDOC_DIR/srun.pid" 2>/dev/null || true)
    if [[ -n $pid ]] && kill -TERM "$pid" 2>/dev/null; then
        rm -f "$HANGDOC_DIR/srun.pid"
        return 0
    fi
    for step in $(squeue --steps --noheader --jobs="$SLURM_JOB_ID" --format='%i %j' \
                  | awk '$2 == "hangdoc-agent" {print $1}'); do
        scancel --signal=TERM "$step"
    done
    rm -f "$HANGDOC_DIR/srun.pid"
}

case ${1:-} in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
