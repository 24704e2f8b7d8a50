# Sourced by the scripts: lets OpenMPI run as root (containers, CI) and finds the binary.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# Ranks waiting on MPI yield the core (the tests run many ranks on 2 cores)
export OMPI_MCA_mpi_yield_when_idle=1
TPTRAIN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TPTRAIN=${TPTRAIN:-$TPTRAIN_ROOT/${BUILD_DIR:-build}/tptrain}
