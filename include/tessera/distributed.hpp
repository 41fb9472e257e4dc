// One process per device (DESIGN §3.7): ts::distributed::init/finalize, ProcessGroup (MPI
// collectives across processes with timeouts) and DistributedDataParallel. Not part of
// tessera.hpp: it needs MPI (CMake: TESSERA_WITH_MPI, target tessera::distributed).
#pragma once

#include "tessera/distributed/distributed_data_parallel.hpp"
#include "tessera/distributed/process_group.hpp"
