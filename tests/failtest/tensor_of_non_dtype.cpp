// expect: satisfaction of .+Dtype<T>.+with T = std::
// A Tensor's element type must be one of the supported dtypes; the compiler names the concept.
#include <string>

#include "tessera/tensor.hpp"

int main() {
  tessera::Tensor<std::string> t;
  return t.defined() ? 1 : 0;
}
