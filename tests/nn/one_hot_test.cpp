// nn::functional::one_hot (nn/one_hot.hpp) against hand-written results and NumPy's
// np.eye(num_classes)[labels] written out as loops: 1-d, 2-d, 0-dim, empty and transposed
// labels, num_classes given or inferred (max + 1), the result on the labels' device; bad labels
// name the value and its position and leave the labels as they were.
#include <catch2/catch.hpp>

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "tessera/tessera.hpp"

namespace one_hot_test {

namespace ts = tessera;
namespace F = tessera::nn::functional;

using Labels = ts::Tensor<std::int64_t>;

Labels labels_of(const std::vector<std::int64_t>& values, const ts::Shape& shape, int device = 0) {
  return ts::from_vector<std::int64_t>(values, shape, device);
}

// np.eye(num_classes)[labels], flattened: row i is the one-hot row of the i-th label.
std::vector<std::int64_t> eye_rows(const std::vector<std::int64_t>& labels,
                                   std::int64_t num_classes) {
  std::vector<std::int64_t> out;
  for (std::int64_t label : labels) {
    for (std::int64_t c = 0; c < num_classes; ++c) out.push_back(c == label ? 1 : 0);
  }
  return out;
}

TEST_CASE("one_hot of 1-d labels: given and inferred num_classes", "[nn][one_hot]") {
  const Labels labels = labels_of({0, 2, 1, 2}, {4});
  const Labels inferred = F::one_hot(labels);  // max 2: three classes
  CHECK(inferred.shape() == ts::Shape{4, 3});
  CHECK(inferred.to_vector() == std::vector<std::int64_t>{1, 0, 0,  //
                                                          0, 0, 1,  //
                                                          0, 1, 0,  //
                                                          0, 0, 1});
  const Labels five = F::one_hot(labels, 5);
  CHECK(five.shape() == ts::Shape{4, 5});
  CHECK(five.to_vector() == std::vector<std::int64_t>{1, 0, 0, 0, 0,  //
                                                      0, 0, 1, 0, 0,  //
                                                      0, 1, 0, 0, 0,  //
                                                      0, 0, 1, 0, 0});
}

TEST_CASE("one_hot adds a last dimension to labels of any shape", "[nn][one_hot]") {
  // [2, 2] labels, 4 classes: [2, 2, 4].
  const Labels square = F::one_hot(labels_of({3, 0, 1, 1}, {2, 2}), 4);
  CHECK(square.shape() == ts::Shape{2, 2, 4});
  CHECK(square.to_vector() == std::vector<std::int64_t>{0, 0, 0, 1,  //
                                                        1, 0, 0, 0,  //
                                                        0, 1, 0, 0,  //
                                                        0, 1, 0, 0});
  // 0-dim labels: a vector of num_classes.
  const Labels scalar = F::one_hot(labels_of({2}, {}), 3);
  CHECK(scalar.shape() == ts::Shape{3});
  CHECK(scalar.to_vector() == std::vector<std::int64_t>{0, 0, 1});
  // A transposed (non-contiguous) view: [[0, 1, 2], [2, 0, 1]]^T = [[0, 2], [1, 0], [2, 1]].
  const Labels transposed = labels_of({0, 1, 2, 2, 0, 1}, {2, 3}).transpose(0, 1);
  REQUIRE_FALSE(transposed.is_contiguous());
  const Labels t = F::one_hot(transposed);
  CHECK(t.shape() == ts::Shape{3, 2, 3});
  CHECK(t.to_vector() == eye_rows({0, 2, 1, 0, 2, 1}, 3));
  // [3, 4, 5] labels from a hash, 7 classes, against np.eye(7)[labels].
  std::vector<std::int64_t> values(60);
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<std::int64_t>((i * 37 + 11) % 7);
  }
  const Labels cube = F::one_hot(labels_of(values, {3, 4, 5}), 7);
  CHECK(cube.shape() == ts::Shape{3, 4, 5, 7});
  CHECK(cube.to_vector() == eye_rows(values, 7));
}

TEST_CASE("one_hot of empty labels, and the result's device", "[nn][one_hot]") {
  const Labels empty = F::one_hot(labels_of({}, {0}), 4);
  CHECK(empty.shape() == ts::Shape{0, 4});
  const Labels empty_rows = F::one_hot(labels_of({}, {2, 0}), 3);
  CHECK(empty_rows.shape() == ts::Shape{2, 0, 3});
  // torch: "Can not infer total number of classes from empty tensor."
  CHECK_THROWS_WITH(F::one_hot(labels_of({}, {0})),
                    Catch::Contains("cannot infer num_classes") && Catch::Contains("[0]"));
  // On cpu:1 (TESSERA_CPU_DEVICES=2): the result there too.
  const Labels on_one = F::one_hot(labels_of({1, 0}, {2}, 1), 2);
  CHECK(on_one.device_index() == 1);
  CHECK(on_one.to_vector() == std::vector<std::int64_t>{0, 1, 1, 0});
}

TEST_CASE("one_hot refuses bad labels, naming the value and its position", "[nn][one_hot]") {
  const Labels negative = labels_of({0, 2, -1, 1}, {4});
  CHECK_THROWS_AS(F::one_hot(negative), ts::error);
  CHECK_THROWS_WITH(F::one_hot(negative, 3),
                    Catch::Contains("label -1 at position [2]") &&
                        Catch::Contains("non-negative"));
  const Labels large = labels_of({0, 1, 5, 2, 7, 0}, {2, 3});
  CHECK_THROWS_WITH(F::one_hot(large, 4), Catch::Contains("label 5 at position [0, 2]") &&
                                              Catch::Contains("num_classes 4") &&
                                              Catch::Contains("labels [2, 3]"));
  CHECK_THROWS_WITH(F::one_hot(large, -2), Catch::Contains("got -2"));
  CHECK_THROWS_AS(F::one_hot(large, -2), std::invalid_argument);
  // The labels are as they were.
  CHECK(negative.to_vector() == std::vector<std::int64_t>{0, 2, -1, 1});
  CHECK(large.to_vector() == std::vector<std::int64_t>{0, 1, 5, 2, 7, 0});
  // num_classes exactly max + 1 is accepted; 0 classes only for empty labels.
  CHECK(F::one_hot(large, 8).shape() == ts::Shape{2, 3, 8});
  CHECK_THROWS_WITH(F::one_hot(labels_of({0}, {1}), 0), Catch::Contains("num_classes 0"));
}

}  // namespace one_hot_test
