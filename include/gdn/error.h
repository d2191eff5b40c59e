#pragma once
// The one exception the library throws: the message names the argument and what was expected.

#include <stdexcept>
#include <string>

namespace gdn {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace gdn
