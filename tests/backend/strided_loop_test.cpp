// The strided loops' layouts (backend/cpu/strided_loop.hpp): dimensions put in the output's
// memory order before merging, against hand-derived merged shapes and strides.
#include <catch2/catch.hpp>

#include <array>

#include "tessera/backend/cpu/strided_loop.hpp"

namespace strided_loop_test {

namespace ts = tessera;
using ts::backend::cpu::strided_layout;

TEST_CASE("channels_last operands merge into one run in memory order", "[strided_loop]") {
  const ts::Shape shape{2, 3, 4, 5};
  const ts::Strides nhwc{60, 1, 15, 3};
  const auto layout = strided_layout<3>::in_memory_order(shape, {nhwc, nhwc, nhwc});
  CHECK(layout.shape == ts::Shape{120});
  for (const auto& strides : layout.strides) CHECK(strides == ts::Strides{1});
  // In logical order they do not merge beyond H and W: [N, C, H*W] with C's stride 1.
  const strided_layout<2> logical(shape, {nhwc, nhwc});
  CHECK(logical.shape == ts::Shape{2, 3, 20});
  CHECK(logical.strides[0] == ts::Strides{60, 1, 3});
}

TEST_CASE("the output's order decides; the operands follow", "[strided_loop]") {
  const ts::Shape shape{2, 3, 4, 5};
  // Output NHWC, input NCHW: walked N, (H W), C; the input steps by 20 along C.
  const auto mixed = strided_layout<2>::in_memory_order(
      shape, {ts::Strides{60, 1, 15, 3}, ts::Strides{60, 20, 5, 1}});
  CHECK(mixed.shape == ts::Shape{2, 20, 3});
  CHECK(mixed.strides[0] == ts::Strides{60, 3, 1});
  CHECK(mixed.strides[1] == ts::Strides{60, 1, 20});
  // A row-major output keeps the logical order.
  const auto row_major = strided_layout<2>::in_memory_order(
      shape, {ts::Strides{60, 20, 5, 1}, ts::Strides{60, 1, 15, 3}});
  CHECK(row_major.shape == ts::Shape{2, 3, 20});
  CHECK(row_major.strides[0] == ts::Strides{60, 20, 1});
  CHECK(row_major.strides[1] == ts::Strides{60, 1, 3});
  // A broadcast channel bias (stride 0 except along C) says nothing about the order.
  const auto bias = strided_layout<2>::in_memory_order(
      shape, {ts::Strides{60, 1, 15, 3}, ts::Strides{0, 1, 0, 0}});
  CHECK(bias.shape == ts::Shape{40, 3});
  CHECK(bias.strides[0] == ts::Strides{3, 1});
  CHECK(bias.strides[1] == ts::Strides{0, 1});
}

}  // namespace strided_loop_test
