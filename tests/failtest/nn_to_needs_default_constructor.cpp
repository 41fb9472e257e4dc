// expect: ts::nn::to<Kind>\(module\): the model type on the new kind has no default constructor
// Converting a user model to another device builds the model's type for that kind, so a model
// whose constructor needs arguments must say how (a default constructor or a member copy_to).
#include "tessera/tessera.hpp"

template <class K>
struct Net : tessera::nn::Module {
  tessera::nn::Linear<float, K> fc;
  explicit Net(int width) : fc(width, width) { register_module("fc", fc); }
};

int main() {
  Net<tessera::cpu> net(4);
  auto copy = tessera::nn::to<tessera::cpu>(net, 0);
  return static_cast<int>(copy.parameters().size());
}
