# Sourced by the scripts: lets OpenMPI run as root (containers, CI) and finds the binary.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# Ranks waiting on MPI yield the core (the tests run many ranks on 2 cores)
export OMPI_MCA_mpi_yield_when_idle=1
# OpenMP threads sleep between loops: tptrain sets this itself by re-executing once (core/cpu/blas_select.h),
# which set here it skips (0.1 s of every process of the tests)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
TPTRAIN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TPTRAIN=${TPTRAIN:-$TPTRAIN_ROOT/${BUILD_DIR:-build}/tptrain}
# tptrain by name in this shell too (where setup.sh's link is not on the PATH): its folder at the end of the PATH
if [ -x "$TPTRAIN" ]; then
  case ":$PATH:" in *":$(dirname "$TPTRAIN"):"*) ;; *) export PATH="$PATH:$(dirname "$TPTRAIN")";; esac
fi
