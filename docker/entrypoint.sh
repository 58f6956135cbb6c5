#!/bin/sh
# Spark binds to and advertises SPARK_LOCAL_IP. sessionlake defaults it to 127.0.0.1 (right
# on one machine); in a container the executors on other containers must reach the driver
# and the workers, so use this container's address unless one was given.
set -e
if [ -z "${SPARK_LOCAL_IP:-}" ]; then
  SPARK_LOCAL_IP="$(hostname -i | awk '{print $1}')"
  export SPARK_LOCAL_IP
fi
exec "$@"
