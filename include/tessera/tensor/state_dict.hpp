// StateDict: an ordered name -> AnyTensor map (insertion order, like PyTorch's OrderedDict) used
// by modules, optimisers and checkpoints.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tessera/tensor/any_tensor.hpp"

namespace tessera {

class StateDict {
 public:
  using value_type = std::pair<std::string, AnyTensor>;
  using const_iterator = std::vector<value_type>::const_iterator;

  StateDict() = default;
  StateDict(std::initializer_list<value_type> items) {
    for (const auto& [key, tensor] : items) insert(key, tensor);
  }

  /// Adds `key`, or replaces its tensor keeping its position.
  void insert(const std::string& key, AnyTensor tensor) {
    if (auto it = index_.find(key); it != index_.end()) {
      items_[it->second].second = std::move(tensor);
      return;
    }
    index_.emplace(key, items_.size());
    items_.emplace_back(key, std::move(tensor));
  }

  /// The tensor of `key`; throws std::out_of_range naming the key.
  const AnyTensor& at(const std::string& key) const {
    auto it = index_.find(key);
    if (it == index_.end()) throw std::out_of_range("StateDict: no key '" + key + "'");
    return items_[it->second].second;
  }
  AnyTensor& at(const std::string& key) {
    return const_cast<AnyTensor&>(std::as_const(*this).at(key));
  }

  bool contains(const std::string& key) const { return index_.count(key) != 0; }
  std::size_t size() const noexcept { return items_.size(); }
  bool empty() const noexcept { return items_.empty(); }

  /// Removes `key` if present; returns whether it was.
  bool erase(const std::string& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return false;
    items_.erase(items_.begin() + static_cast<std::ptrdiff_t>(it->second));
    index_.erase(it);
    for (std::size_t i = 0; i < items_.size(); ++i) index_[items_[i].first] = i;
    return true;
  }

  /// Keys in insertion order.
  std::vector<std::string> keys() const {
    std::vector<std::string> out;
    out.reserve(items_.size());
    for (const auto& item : items_) out.push_back(item.first);
    return out;
  }

  const_iterator begin() const noexcept { return items_.begin(); }
  const_iterator end() const noexcept { return items_.end(); }

 private:
  std::vector<value_type> items_;
  std::unordered_map<std::string, std::size_t> index_;
};

}  // namespace tessera
