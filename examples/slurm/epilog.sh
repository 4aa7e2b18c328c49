#!/bin/sh
# Slurm epilog: when a job ends on this node, append `gpuwatch job-report` of it (each of its
# GPUs here: mean and peak utilisation, peak memory, time idle) to
# $GPUWATCH_JOB_REPORT_DIR/JOBID.txt, readable by the job's user.
#
#   slurm.conf:  Epilog=/etc/slurm/epilog.d/gpuwatch-job-report.sh
#
# It never fails the epilog (a failing epilog drains the node): it always exits 0, and
# gives up after GPUWATCH_JOB_REPORT_TIMEOUT seconds. The report is written by root into a
# directory only root may write, never into the job's own output file: a path the user
# chose could lead root's write anywhere.
# Settings: edit them here (slurmd gives an epilog few variables of its own).

report_dir=${GPUWATCH_JOB_REPORT_DIR:-/var/log/gpuwatch/jobs}
gpuwatch=${GPUWATCH:-gpuwatch}
timeout_s=${GPUWATCH_JOB_REPORT_TIMEOUT:-15}
PATH=$PATH:/usr/local/bin:/usr/bin:/bin
export PATH

[ -n "$SLURM_JOB_GPUS" ] || exit 0 # no GPU of this node: nothing to report
case $SLURM_JOB_ID in '' | *[!0-9_]*) exit 0 ;; esac

# The folders above the reports (/var/log/gpuwatch) 0755, so that users can pass through
# them; the reports' own 0711: each user reads their own report by its name, and lists no
# one else's job. (`mkdir -p -m` sets the last folder's mode only: the others take the
# umask, which is why the umask for the reports is set only after.)
if [ ! -d "$report_dir" ]; then
    (umask 022 && mkdir -p "$report_dir" && chmod 0711 "$report_dir") 2>/dev/null || exit 0
fi
umask 077
out=$report_dir/$SLURM_JOB_ID.txt
tmp=$(mktemp "$report_dir/.$SLURM_JOB_ID.XXXXXX" 2>/dev/null) || exit 0

if command -v timeout >/dev/null 2>&1; then
    timeout -k 2 "$timeout_s" "$gpuwatch" job-report "$SLURM_JOB_ID" >"$tmp" 2>&1
else
    "$gpuwatch" job-report "$SLURM_JOB_ID" >"$tmp" 2>&1
fi
case $? in
    124 | 137) echo "gpuwatch job-report: no answer in ${timeout_s}s" >>"$tmp" ;;
esac

# One write per node: nodes of one job appending to a shared directory do not interleave.
cat "$tmp" >>"$out" 2>/dev/null
rm -f "$tmp"
if [ -n "$SLURM_JOB_UID" ]; then
    chown "$SLURM_JOB_UID" "$out" 2>/dev/null
fi
exit 0
