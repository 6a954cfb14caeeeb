#!/usr/bin/env bash
# Runs a command in a new Unix session, then ends the TFF `worker_binary` processes left in that
# session. TFF leaves one orphan worker_binary per process that ran a computation; it is re-parented to
# PID 1 but keeps the session id, which is how we find it (see README, "Environment notes").
# Usage: tools/in_session.sh CMD [ARGS...]; exits with CMD's exit code.
set -u
setsid "$@" &
leader=$!
trap 'kill -TERM -- "$leader" 2>/dev/null' INT TERM
wait "$leader"
status=$?
reap() {
  ps -eo pid=,sid=,args= | awk -v sid="$leader" '$2 == sid && $3 ~ /worker_binary/ {print $1}'
}
for attempt in 1 2 3; do
  pids=$(reap)
  [ -z "$pids" ] && break
  kill $pids 2>/dev/null
  sleep 1
done
pids=$(reap)
[ -n "$pids" ] && kill -9 $pids 2>/dev/null
exit "$status"
