// Optimisers in one include (DESIGN §3.6): SGD, Adam, AdamW over nn::ParameterRef lists, the
// learning-rate schedulers, and GradScaler (mixed precision, §3.8).
#pragma once

#include "tessera/optim/adam.hpp"
#include "tessera/optim/grad_scaler.hpp"
#include "tessera/optim/lr_scheduler.hpp"
#include "tessera/optim/optimizer.hpp"
#include "tessera/optim/sgd.hpp"
