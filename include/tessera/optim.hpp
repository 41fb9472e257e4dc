// Optimisers in one include (DESIGN §3.6): SGD, Adam, AdamW over nn::ParameterRef lists, and
// the learning-rate schedulers.
#pragma once

#include "tessera/optim/adam.hpp"
#include "tessera/optim/lr_scheduler.hpp"
#include "tessera/optim/optimizer.hpp"
#include "tessera/optim/sgd.hpp"
