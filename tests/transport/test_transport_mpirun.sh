#!/usr/bin/env bash
# tests/transport/test_transport_mpirun.sh: 4 ranks under mpirun, bootstrapped
# from Open MPI's variables (no BRIGADE_* set), allreduce checked exactly.
. "$(dirname "$0")/../lib/harness.sh"
bin=$BRIGADE_BINARY_DIR/tests/transport/bgt_mpi_allreduce
unset BRIGADE_RANK BRIGADE_WORLD_SIZE BRIGADE_MASTER_PORT BRIGADE_MASTER_ADDR MASTER_PORT MASTER_ADDR RANK WORLD_SIZE
export BRIGADE_TIMEOUT=30
rc=0
out=$(timeout 90 mpirun --allow-run-as-root --oversubscribe -np 4 "$bin" 2>&1) || rc=$?
echo "$out"
[ $rc -eq 0 ] || die "mpirun exited $rc"
grep -q "bgt_mpi_allreduce: 4 ranks OK" <<<"$out" && ok "4 ranks under mpirun: allreduce exact" || bad "rank 0 did not report success"
finish
