// StateDict: an ordered name -> AnyTensor map (insertion order, like PyTorch's OrderedDict) used
// by modules, optimisers and checkpoints.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tessera/core/config.hpp"
#include "tessera/tensor/any_tensor.hpp"

namespace tessera {

class StateDict {
 public:
  using value_type = std::pair<std::string, AnyTensor>;
  using const_iterator = std::vector<value_type>::const_iterator;

  StateDict() = default;
  TESSERA_API StateDict(std::initializer_list<value_type> items);

  /// Adds `key`, or replaces its tensor keeping its position.
  TESSERA_API void insert(const std::string& key, AnyTensor tensor);

  /// The tensor of `key`; throws std::out_of_range naming the key.
  TESSERA_API const AnyTensor& at(const std::string& key) const;
  AnyTensor& at(const std::string& key) {
    return const_cast<AnyTensor&>(std::as_const(*this).at(key));
  }

  TESSERA_API bool contains(const std::string& key) const;
  std::size_t size() const noexcept { return items_.size(); }
  bool empty() const noexcept { return items_.empty(); }

  /// Removes `key` if present; returns whether it was.
  TESSERA_API bool erase(const std::string& key);

  /// Keys in insertion order.
  TESSERA_API std::vector<std::string> keys() const;

  const_iterator begin() const noexcept { return items_.begin(); }
  const_iterator end() const noexcept { return items_.end(); }

 private:
  std::vector<value_type> items_;
  std::unordered_map<std::string, std::size_t> index_;
};

// Out of line in compiled mode (core/config.hpp): the map's code is compiled once.
#if TESSERA_DEFINITIONS
TESSERA_API StateDict::StateDict(std::initializer_list<value_type> items) {
  for (const auto& [key, tensor] : items) insert(key, tensor);
}
TESSERA_API void StateDict::insert(const std::string& key, AnyTensor tensor) {
  if (auto it = index_.find(key); it != index_.end()) {
    items_[it->second].second = std::move(tensor);
    return;
  }
  index_.emplace(key, items_.size());
  items_.emplace_back(key, std::move(tensor));
}
TESSERA_API const AnyTensor& StateDict::at(const std::string& key) const {
  auto it = index_.find(key);
  if (it == index_.end()) throw std::out_of_range("StateDict: no key '" + key + "'");
  return items_[it->second].second;
}
TESSERA_API bool StateDict::contains(const std::string& key) const {
  return index_.count(key) != 0;
}
TESSERA_API bool StateDict::erase(const std::string& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  items_.erase(items_.begin() + static_cast<std::ptrdiff_t>(it->second));
  index_.erase(it);
  for (std::size_t i = 0; i < items_.size(); ++i) index_[items_[i].first] = i;
  return true;
}
TESSERA_API std::vector<std::string> StateDict::keys() const {
  std::vector<std::string> out;
  out.reserve(items_.size());
  for (const auto& item : items_) out.push_back(item.first);
  return out;
}
#endif  // TESSERA_DEFINITIONS

}  // namespace tessera
