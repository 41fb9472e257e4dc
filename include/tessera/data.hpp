// Data loading (DESIGN §3.8): Dataset, TensorDataset, DataLoader, load_digits. Not part of tessera.hpp: it
// brings <thread> (its workers), which every user would pay for.
#pragma once

#include "tessera/data/data_loader.hpp"
#include "tessera/data/datasets.hpp"
