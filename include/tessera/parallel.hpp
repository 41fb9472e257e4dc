// Parallelism over several devices (DESIGN §3.7): device threads and in-process collectives.
#pragma once

#include "tessera/parallel/communicator.hpp"
#include "tessera/parallel/device_threads.hpp"
