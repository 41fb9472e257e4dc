// Reads the reference arrays that tests/oracles/nn_torch.py computes with PyTorch. The script is
// run from the test (std::system, Debian's /usr/bin/python3: TESSERA_ORACLE_PYTHON), once per
// section and test program; without PyTorch it exits 2 and the test fails, saying to install it.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tessera/tessera.hpp"

#ifndef TESSERA_ORACLE_SCRIPTS
#error "TESSERA_ORACLE_SCRIPTS (the folder of nn_torch.py) must be defined by the build"
#endif
#ifndef TESSERA_ORACLE_PYTHON
#define TESSERA_ORACLE_PYTHON "/usr/bin/python3"
#endif

namespace torch_oracle {

struct array {
  std::string dtype;
  tessera::Shape shape;
  std::vector<double> values;  // float32 values are exact in double; int64 ones are small
};

class file {
 public:
  /// Runs nn_torch.py for `section` ("layers", "optim", "autograd", "conv", "resnet") and reads
  /// its output.
  explicit file(const std::string& section) {
    const char* oracle_dir = std::getenv("TESSERA_ORACLE_DIR");
    const std::filesystem::path directory =
        (oracle_dir ? std::filesystem::path(oracle_dir) : std::filesystem::temp_directory_path()) /
        "nn_torch";
    std::filesystem::create_directories(directory);
    path_ = directory / (section + ".txt");
    const auto& path = path_;
    const std::string command = std::string(TESSERA_ORACLE_PYTHON) + " \"" +
                                TESSERA_ORACLE_SCRIPTS + "/nn_torch.py\" " + section + " \"" +
                                path.string() + "\"";
    if (std::system(command.c_str()) != 0) {
      throw std::runtime_error("the PyTorch oracle failed: " + command +
                               "\n(it needs Debian's python3-torch for /usr/bin/python3: run "
                               "`bash cmake/install-deps.sh --test`)");
    }
    std::ifstream in(path);
    std::string header, values;
    while (std::getline(in, header) && std::getline(in, values)) {
      std::istringstream h(header);
      std::string name, shape_text;
      array a;
      h >> name >> a.dtype >> shape_text;
      if (shape_text != "-") {
        std::istringstream s(shape_text);
        std::string extent;
        while (std::getline(s, extent, ',')) a.shape.push_back(std::stoll(extent));
      }
      std::istringstream v(values);
      std::string word;
      while (v >> word) a.values.push_back(std::strtod(word.c_str(), nullptr));
      order_.push_back(name);
      arrays_.emplace(name, std::move(a));
    }
    if (arrays_.empty())
      throw std::runtime_error("the PyTorch oracle wrote nothing to " + path.string());
  }

  bool contains(const std::string& name) const { return arrays_.count(name) != 0; }

  /// The file the script wrote (side files, e.g. safetensors checkpoints, sit beside it as
  /// path() + ".<name>.safetensors").
  const std::filesystem::path& path() const { return path_; }

  /// The names that start with `prefix`, in the order the script wrote them.
  std::vector<std::string> names_with_prefix(const std::string& prefix) const {
    std::vector<std::string> out;
    for (const auto& name : order_) {
      if (name.compare(0, prefix.size(), prefix) == 0) out.push_back(name);
    }
    return out;
  }

  const array& at(const std::string& name) const {
    auto it = arrays_.find(name);
    if (it == arrays_.end()) throw std::runtime_error("no oracle array '" + name + "'");
    return it->second;
  }

  /// The array as a tensor of dtype T on cpu:`device`.
  template <class T>
  tessera::Tensor<T> tensor(const std::string& name, int device = 0) const {
    const array& a = at(name);
    std::vector<T> values;
    for (double v : a.values) values.push_back(static_cast<T>(v));
    return tessera::from_vector<T>(values, a.shape, device);
  }

 private:
  std::filesystem::path path_;
  std::vector<std::string> order_;
  std::map<std::string, array> arrays_;
};

/// Every element of `actual` within atol + rtol * |expected| of the oracle array `name`
/// (shapes equal); reports the first difference.
template <class T>
void check_close(const tessera::Tensor<T>& actual, const array& expected, double rtol,
                 double atol) {
  REQUIRE(actual.shape() == expected.shape);
  const auto values = actual.to_vector();
  std::size_t bad = 0;
  std::ostringstream first;
  first.precision(17);
  double worst = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double a = static_cast<double>(values[i]);
    const double e = expected.values[i];
    const double error = std::abs(a - e);
    worst = std::max(worst, error / (atol + rtol * std::abs(e)));
    if (!(error <= atol + rtol * std::abs(e)) && bad++ == 0) {
      first << "element " << i << ": tessera " << a << ", torch " << e;
    }
  }
  INFO(bad << " of " << values.size() << " elements differ; first " << first.str()
           << "; worst error / tolerance " << worst);
  CHECK(bad == 0);
}

}  // namespace torch_oracle
