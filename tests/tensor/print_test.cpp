// operator<< for tensors: PyTorch's layout, checked against the text PyTorch 2 prints for the
// same tensors (written out by hand from torch's output).
#include <catch2/catch.hpp>

#include <sstream>
#include <string>

#include "tessera/tessera.hpp"

namespace print_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;

namespace {
template <class T>
std::string text(const T& t) {
  std::ostringstream os;
  os << t;
  return os.str();
}
}  // namespace

TEST_CASE("print matches PyTorch's layout", "[tensor][print]") {
  CHECK(text(ts::arange<float>(0, 6).view({2, 3})) ==
        "tensor([[0., 1., 2.],\n        [3., 4., 5.]])");
  CHECK(text(ts::from_vector<float>({0.5f, -1.25f}, {2})) == "tensor([ 0.5000, -1.2500])");
  CHECK(text(ts::from_vector<int64_t>({1, -20, 3}, {3})) == "tensor([  1, -20,   3])");
  CHECK(text(ts::from_vector<int32_t>({1, 2}, {2})) == "tensor([1, 2], dtype=int32)");
  CHECK(text(ts::full<bool>({2}, true)) == "tensor([True, True])");
  CHECK(text(ts::full<double>({}, 2.0)) == "tensor(2., dtype=float64)");
  CHECK(text(ts::zeros<float>({0})) == "tensor([])");
  CHECK(text(ts::zeros<float>({0, 3})) == "tensor([], size=(0, 3))");
  CHECK(text(ts::from_vector<float>({1e-5f, 1.0f}, {2})) == "tensor([1.0000e-05, 1.0000e+00])");
  CHECK(text(ts::zeros<float>({2}, 1)) == "tensor([0., 0.], device='cpu:1')");
  CHECK(text(ts::Tensor<float>()) == "tensor(undefined)");
}

TEST_CASE("long tensors are summarised", "[tensor][print]") {
  CHECK(text(ts::arange<int64_t>(2000)) == "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])");
  std::string matrix = text(ts::arange<float>(0, 2000).view({2, 1000}));
  CHECK(matrix ==
        "tensor([[   0.,    1.,    2.,  ...,  997.,  998.,  999.],\n"
        "        [1000., 1001., 1002.,  ..., 1997., 1998., 1999.]])");
}

}  // namespace print_test
