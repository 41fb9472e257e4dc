// DataLoader under faults and extreme options (issue 46): after a failing example every other
// batch still arrives (the error raised at the failed one, as its own kind, as PyTorch's), an
// iterator outlives its loader safely (ASan would report its workers reading a freed dataset),
// and batch_size or prefetch_factor at the top of their types give the right batches instead of
// none or an int overflow. Labelled `threads` (workers), so the TSan build runs it.
#include <catch2/catch.hpp>

#include <climits>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tessera/data/data_loader.hpp"
#include "tessera/tessera.hpp"

namespace data_loader_faults_threads_test {

namespace ts = tessera;
using ts::data::DataLoader;

// Example i is [i, i]; example 13 cannot be read.
struct failing_dataset {
  std::int64_t size() const { return 20; }
  ts::Tensor<float> get(std::int64_t i) const {
    if (i == 13) throw std::runtime_error("the file of example 13 is damaged");
    return ts::full<float>({2}, static_cast<float>(i));
  }
};

TEST_CASE("after a failing example, every other batch still arrives", "[data][failure]") {
  for (int workers : {0, 1, 2, 3}) {
    CAPTURE(workers);
    DataLoader loader(failing_dataset{},
                      {.batch_size = 4, .num_workers = workers, .prefetch_factor = 1});
    std::vector<float> firsts;
    int errors = 0;
    auto it = loader.begin();
    for (std::int64_t k = 0; it != loader.end(); ++it, ++k) {
      try {
        firsts.push_back((*it)[0][0].item());
      } catch (const ts::error& e) {
        ++errors;
        CHECK(k == 3);
        CHECK(std::string(e.what()).find("batch 3 (example 13)") != std::string::npos);
      }
    }
    CHECK(errors == 1);
    CHECK(firsts == std::vector<float>{0, 4, 8, 16});  // batch 3 (12..15) raised; 4 arrived
  }
}

// Example 5 runs out of memory, 9 has the wrong shape, 14 is out of range, 17 is not a
// std::exception at all.
struct typed_failures {
  std::int64_t size() const { return 20; }
  ts::Tensor<float> get(std::int64_t i) const {
    if (i == 5) throw ts::out_of_memory_error("Out of memory. Tried to allocate 2 GiB");
    if (i == 9) throw ts::shape_error("example 9 has shape [3]");
    if (i == 14) throw std::out_of_range("index 14 past the file's end");
    if (i == 17) throw 17;
    return ts::full<float>({2}, static_cast<float>(i));
  }
};

TEST_CASE("a failing example's exception reaches the loop as its own kind", "[data][failure]") {
  // As PyTorch re-raises a worker's exception as its class: `catch (out_of_memory_error&)`
  // around the loop still catches an example that ran out of memory (it was a plain ts::error).
  for (int workers : {0, 2}) {
    CAPTURE(workers);
    DataLoader loader(typed_failures{}, {.batch_size = 4, .num_workers = workers});
    auto it = loader.begin();
    auto next = [&] {  // batch k holds examples 4k .. 4k + 3
      try {
        const auto batch = *it;
        ++it;
        return batch;
      } catch (...) {
        ++it;
        throw;
      }
    };
    CHECK(next()[0][0].item() == 0);
    CHECK_THROWS_AS(next(), ts::out_of_memory_error);
    CHECK_THROWS_AS(next(), ts::shape_error);
    std::string message;
    try {
      (void)next();
    } catch (const std::out_of_range& e) {
      message = e.what();
    }
    CHECK(message == "DataLoader: batch 3 (example 14): index 14 past the file's end");
    CHECK_THROWS_WITH(next(), Catch::Contains("batch 4 (example 17): an exception that is not"));
    CHECK(it == loader.end());
  }
}

TEST_CASE("an iterator outlives its loader", "[data][failure]") {
  for (int workers : {0, 2}) {
    CAPTURE(workers);
    std::optional<DataLoader<failing_dataset>> loader;
    loader.emplace(failing_dataset{},
                   ts::data::DataLoaderOptions{.batch_size = 2, .num_workers = workers});
    auto it = loader->begin();
    const auto end = loader->end();
    loader.reset();  // the workers go on reading the dataset, which the epoch shares
    std::vector<float> firsts;
    for (; it != end; ++it) {
      try {
        firsts.push_back((*it)[0][0].item());
      } catch (const ts::error&) {
        firsts.push_back(-1);  // batch 6 holds example 13
      }
    }
    CHECK(firsts == std::vector<float>{0, 2, 4, 6, 8, 10, -1, 14, 16, 18});
  }
}

TEST_CASE("batch_size and prefetch_factor at the top of their types", "[data][failure]") {
  // INT64_MAX: one batch of every example ((n + b - 1) / b overflowed and gave none).
  DataLoader one(failing_dataset{}, {.batch_size = std::numeric_limits<std::int64_t>::max()});
  CHECK(one.size() == 1);
  DataLoader dropped(failing_dataset{},
                     {.batch_size = std::numeric_limits<std::int64_t>::max(), .drop_last = true});
  CHECK(dropped.size() == 0);
  int batches = 0;
  for (auto x : dropped) {
    (void)x;
    ++batches;
  }
  CHECK(batches == 0);
  // INT_MAX: num_workers * prefetch_factor overflowed an int; the ring is the epoch's batches.
  struct rows {
    std::int64_t size() const { return 9; }
    ts::Tensor<float> get(std::int64_t i) const {
      return ts::full<float>({1}, static_cast<float>(i));
    }
  };
  DataLoader wide(rows{}, {.batch_size = 2, .num_workers = 3, .prefetch_factor = INT_MAX});
  std::vector<float> seen;
  for (auto x : wide) {
    for (float v : x.to_vector()) seen.push_back(v);
  }
  CHECK(seen == std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8});
  DataLoader all(rows{},
                 {.batch_size = std::numeric_limits<std::int64_t>::max(), .num_workers = 2});
  seen.clear();
  for (auto x : all) {
    CHECK(x.shape() == ts::Shape{9, 1});
    for (float v : x.to_vector()) seen.push_back(v);
  }
  CHECK(seen == std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8});
}

}  // namespace data_loader_faults_threads_test
