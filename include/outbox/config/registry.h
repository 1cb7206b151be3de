#pragma once
// A list of named backend types (sink types, store types) that a program loops over: each type
// registers once under the name its configuration's `type = "<name>"` selects.

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "outbox/config/toml_table.h"

namespace outbox::config {

// `Type` has a `std::string name` member. `kind` names what is registered, for messages ("sink").
template <typename Type>
class Registry {
 public:
  // Adds `types` in order (Add's checks apply).
  Registry(std::string kind, std::initializer_list<Type> types) : kind_(std::move(kind)) {
    for (const Type& type : types) Add(type);
  }

  // Throws std::logic_error for a second type of the same name.
  void Add(Type type) {
    if (Find(type.name) != nullptr) {
      throw std::logic_error(kind_ + " type registered twice: " + type.name);
    }
    types_.push_back(std::move(type));
  }
  [[nodiscard]] const Type* Find(std::string_view name) const {
    const auto found = std::find_if(types_.begin(), types_.end(),
                                    [&](const Type& type) { return type.name == name; });
    return found == types_.end() ? nullptr : &*found;
  }
  // The names for a message: "\"postgres\" or \"sqlite\"", "\"rabbitmq\", \"file\" or \"kafka\"".
  [[nodiscard]] std::string Names() const {
    std::string names;
    for (std::size_t i = 0; i < types_.size(); ++i) {
      if (i > 0) names += i + 1 == types_.size() ? " or " : ", ";
      names += Quoted(types_[i].name);
    }
    return names;
  }
  [[nodiscard]] const std::vector<Type>& types() const { return types_; }

 private:
  std::string kind_;
  std::vector<Type> types_;
};

}  // namespace outbox::config
