#!/bin/sh
# Spark binds to and advertises SPARK_LOCAL_IP. sessionlake defaults it to 127.0.0.1 (right
# on one machine); in a container the executors on other containers must reach the driver
# and the workers, so use this container's address unless one was given.
set -e
if [ -z "${SPARK_LOCAL_IP:-}" ]; then
  SPARK_LOCAL_IP="$(hostname -i | awk '{print $1}')"
  export SPARK_LOCAL_IP
fi
if [ "${SESSIONLAKE_STOP_CONTINUOUS_RUN_AT_EXIT:-}" != "true" ]; then
  exec "$@"
fi

# The scheduler's container (compose sets SESSIONLAKE_STOP_CONTINUOUS_RUN_AT_EXIT there)
# also holds the restart DAG's continuous run, in a session of its own: neither the SIGTERM
# tini passes on (docker stop) nor the scheduler's end reaches it, and it would die with
# the container mid-batch. So the command runs as this shell's child; a SIGTERM goes on to
# it and stops the continuous run (its batch in flight commits first); the shell exits,
# with the command's status, once both have stopped. compose's stop_grace_period is the
# time they have before Docker kills what is left.
set +e
stopper=
stop_continuous_run() {
  [ -n "$stopper" ] && return
  "${SESSIONLAKE_PYTHON:-python}" -c \
    'from sessionlake.orchestration import stop_restart_dag_run; stop_restart_dag_run()' &
  stopper=$!
}
# `wait` returns early when a trapped signal arrives: wait again until the process is gone.
wait_for() {
  while :; do
    wait "$1"
    status=$?
    kill -0 "$1" 2>/dev/null || return "$status"
  done
}
"$@" &
command=$!
trap 'kill -TERM "$command" 2>/dev/null; stop_continuous_run' TERM INT
wait_for "$command"
command_status=$?
stop_continuous_run  # also when the command ended by itself: the container ends with it
wait_for "$stopper"
exit "$command_status"
