// expect: one_hot: the labels must be int64 class indices
// one_hot takes int64 class indices, as torch.nn.functional.one_hot does; float labels are a
// compile error that says how to convert them.
#include "tessera/nn/one_hot.hpp"

int main() {
  const auto labels = tessera::zeros<float>({3});
  return static_cast<int>(tessera::nn::functional::one_hot(labels, 2).numel());
}
