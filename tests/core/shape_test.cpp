// Shape: construction, -1 inference, negative dimensions, broadcasting and strides.
#include <catch2/catch.hpp>

#include "tessera/core/shape.hpp"

namespace shape_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;

TEST_CASE("Shape basics", "[shape]") {
  ts::Shape s{2, 3, 4};
  CHECK(s.size() == 3);
  CHECK(s.numel() == 24);
  CHECK(s[1] == 3);
  CHECK(s.str() == "[2, 3, 4]");
  CHECK(ts::Shape{}.numel() == 1);
  CHECK(ts::Shape{}.str() == "[]");
  CHECK(ts::Shape{5, 0}.numel() == 0);
  CHECK(s.contiguous_strides() == ts::Shape{12, 4, 1});
  CHECK(ts::Shape{2, 0, 3}.contiguous_strides() == ts::Shape{3, 3, 1});
  CHECK_THROWS_AS((ts::Shape{1, 1, 1, 1, 1, 1, 1, 1, 1}), ts::shape_error);
  CHECK_NOTHROW((ts::Shape{1, 1, 1, 1, 1, 1, 1, 1}));
}

TEST_CASE("Shape::infer resolves one -1", "[shape]") {
  CHECK(ts::Shape{-1, 4}.infer(12) == ts::Shape{3, 4});
  CHECK(ts::Shape{2, -1, 2}.infer(12) == ts::Shape{2, 3, 2});
  CHECK(ts::Shape{3, 4}.infer(12) == ts::Shape{3, 4});
  CHECK_THROWS_WITH((ts::Shape{-1, 5}.infer(12)), Catch::Contains("[-1, 5]") && Catch::Contains("12"));
  CHECK_THROWS_AS((ts::Shape{-1, -1}.infer(4)), ts::shape_error);
  CHECK_THROWS_AS((ts::Shape{-2, 2}.infer(4)), ts::shape_error);
  CHECK_THROWS_AS((ts::Shape{3, 3}.infer(12)), ts::shape_error);
  CHECK_THROWS_AS((ts::Shape{0, -1}.infer(0)), ts::shape_error);  // ambiguous, as in PyTorch
}

TEST_CASE("normalize_dim counts from the end", "[shape]") {
  ts::Shape s{2, 3, 4};
  CHECK(s.normalize_dim(-1) == 2);
  CHECK(s.normalize_dim(-3) == 0);
  CHECK(s.normalize_dim(1) == 1);
  CHECK_THROWS_WITH(s.normalize_dim(3), Catch::Contains("dimension 3") && Catch::Contains("[-3, 2]"));
  CHECK_THROWS_AS(s.normalize_dim(-4), ts::shape_error);
}

TEST_CASE("broadcast_shapes follows NumPy", "[shape]") {
  CHECK(ts::broadcast_shapes({3, 1}, {1, 4}) == ts::Shape{3, 4});
  CHECK(ts::broadcast_shapes({5, 3, 1}, {4}) == ts::Shape{5, 3, 4});
  CHECK(ts::broadcast_shapes({}, {2, 2}) == ts::Shape{2, 2});
  CHECK(ts::broadcast_shapes({0, 1}, {1, 3}) == ts::Shape{0, 3});
  CHECK_THROWS_WITH(ts::broadcast_shapes({2, 3}, {4, 3}),
                    Catch::Contains("[2, 3]") && Catch::Contains("[4, 3]"));
  CHECK(ts::expand_strides({3, 1}, {1, 1}, {2, 3, 4}) == ts::Shape{0, 1, 0});
  CHECK_THROWS_AS(ts::expand_strides({3}, {1}, {4}), ts::shape_error);
}

}  // namespace shape_test
