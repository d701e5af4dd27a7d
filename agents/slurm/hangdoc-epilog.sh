#!/usr/bin/env bash
# Slurm epilog: stops the agent hangdoc-prolog.sh started for this job and removes its
# token. Always exits 0 (a failing epilog drains the node).
set -uo pipefail
systemctl stop "hangdoc-agent-job$SLURM_JOB_ID.service" 2>/dev/null
rm -rf "/run/hangdoc/job-$SLURM_JOB_ID"
exit 0
