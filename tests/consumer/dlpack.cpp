// A user's program that exchanges tensors through DLPack (tessera::dlpack): a tensor out and back
// in shares its bytes, and the deleter runs once, when the last handle goes.
#include <tessera/io/dlpack.hpp>
#include <tessera/tessera.hpp>

#include <cstdio>
#include <vector>

namespace ts = tessera;

int main() {
  auto a = ts::arange<float>(0, 6).view({2, 3});
  DLManagedTensor* out = ts::to_dlpack(a.t());  // a view: strides (1, 3)
  auto b = ts::from_dlpack<float>(out);          // Tessera owns `out` now
  const bool shared = b.data() == a.data() && b.shape() == ts::Shape{3, 2} &&
                      b.to_vector() == std::vector<float>{0, 3, 1, 4, 2, 5};
  a.fill_(7.0f);
  const bool written = b.to_vector() == std::vector<float>(6, 7.0f);
  std::printf("consumer_dlpack: %s\n", shared && written ? "ok" : "WRONG");
  return shared && written ? 0 : 1;
}
