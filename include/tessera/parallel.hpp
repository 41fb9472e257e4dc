// Parallelism over several devices (DESIGN §3.7): device threads, in-process collectives,
// DataParallel, pipelines and their balance_by_time.
#pragma once

#include "tessera/parallel/balance.hpp"
#include "tessera/parallel/communicator.hpp"
#include "tessera/parallel/data_parallel.hpp"
#include "tessera/parallel/device_threads.hpp"
#include "tessera/parallel/pipeline.hpp"
