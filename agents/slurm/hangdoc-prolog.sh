#!/usr/bin/env bash
# Slurm prolog (runs as root on every node of an allocation, with PrologFlags=Alloc):
# starts a root hangdoc agent for this job, reachable with a per-job token that only the
# job's user can read. hangdoc-epilog.sh stops it. slurm.conf:
#   Prolog=/etc/slurm/prolog.d/*       Epilog=/etc/slurm/epilog.d/*      PrologFlags=Alloc
#   install -m 0755 hangdoc-prolog.sh /etc/slurm/prolog.d/50-hangdoc.sh
#   install -m 0755 hangdoc-epilog.sh /etc/slurm/epilog.d/50-hangdoc.sh
#   (umask 077; openssl rand -hex 32 > /etc/hangdoc/site-secret)  # same file on every node
#
# Inside the job (the batch script runs on the first node, which has the token):
#   cp /run/hangdoc/job-$SLURM_JOB_ID/token ~/.hangdoc-token-$SLURM_JOB_ID
#   scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s/$/:$((18420 + SLURM_JOB_ID % 1000))/" > nodes.txt
#   hangdoc diagnose slurm:$SLURM_JOB_ID --hostfile nodes.txt --token-file ~/.hangdoc-token-$SLURM_JOB_ID
#
# The agent runs as root and can sample any process on the node, so by default it is only
# started for jobs that have their nodes to themselves (--exclusive). A prolog that fails
# drains the node: this one logs its problems and always exits 0.

# ---- variables --------------------------------------------------------------------------
HANGDOC=${HANGDOC:-/opt/hangdoc/bin/hangdoc}
SITE_SECRET=${SITE_SECRET:-/etc/hangdoc/site-secret}
REQUIRE_EXCLUSIVE=${REQUIRE_EXCLUSIVE:-1}
PORT=$((18420 + SLURM_JOB_ID % 1000))
# -----------------------------------------------------------------------------------------

set -uo pipefail
log() { logger -t hangdoc-prolog "job $SLURM_JOB_ID: $*"; }

main() {
    local dir=/run/hangdoc/job-$SLURM_JOB_ID token
    if [[ ! -x $HANGDOC || ! -x $(dirname "$HANGDOC")/python || ! -r $SITE_SECRET ]]; then
        log "not starting an agent: $HANGDOC or $SITE_SECRET missing"
        return 0
    fi
    if [[ $REQUIRE_EXCLUSIVE == 1 ]] \
        && ! scontrol show job --oneliner "$SLURM_JOB_ID" | grep -q 'OverSubscribe=NO'; then
        log "not starting an agent: job does not have its nodes to itself"
        return 0
    fi
    # The same token on every node without any exchange: HMAC(site secret, job id).
    # (computed in Python: openssl would put the site secret on its command line)
    token=$("$(dirname "$HANGDOC")/python" -c '
import hashlib, hmac, sys
key = open(sys.argv[1], "rb").read().strip()
print(hmac.new(key, ("slurm-job:" + sys.argv[2]).encode(), hashlib.sha256).hexdigest())
' "$SITE_SECRET" "$SLURM_JOB_ID")
    install -d -m 0700 -o "$SLURM_JOB_UID" -g "$SLURM_JOB_GID" "$dir"
    (umask 077 && printf '%s\n' "$token" > "$dir/token")
    chown "$SLURM_JOB_UID:$SLURM_JOB_GID" "$dir/token"
    chmod 0400 "$dir/token"

    # A transient systemd unit outlives the prolog and is stopped by name in the epilog.
    if ! systemd-run --unit="hangdoc-agent-job$SLURM_JOB_ID" --collect \
        --property=CapabilityBoundingSet="CAP_SYS_PTRACE CAP_DAC_READ_SEARCH" \
        --property=NoNewPrivileges=yes --property=ProtectSystem=strict \
        --property=ProtectHome=read-only --property=MemoryMax=1G --property=CPUQuota=100% \
        "$HANGDOC" agent --listen "0.0.0.0:$PORT" --token-file "$dir/token" 2>&1 \
        | logger -t hangdoc-prolog; then
        log "systemd-run failed"
    fi
    log "agent on port $PORT"
}

main
exit 0
