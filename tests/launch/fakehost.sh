#!/bin/bash
# tests/launch/fakehost.sh HOST CMD [ARGS...]: a "remote shell" for
# brigade launch --rsh that runs CMD on this machine as if on HOST, for tests
# of --hosts and --elastic without root or network namespaces. Fault
# injection: while $FAKEHOST_DIR/HOST.down exists the host is unreachable
# (exit 255, as ssh); every CMD it starts appends its pid (exec keeps it) to
# $FAKEHOST_DIR/HOST.pids, so that a test can kill "the host's processes".
# It must not do anything else: the launcher's behaviour is what is tested.
host=$1
shift
dir=${FAKEHOST_DIR:?FAKEHOST_DIR is not set}
if [ -e "$dir/$host.down" ]; then
    echo "fakehost: $host: unreachable" >&2
    exit 255
fi
echo $$ >>"$dir/$host.pids"
exec "$@"
