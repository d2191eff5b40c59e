#pragma once
// The message of an exception caught as std::exception_ptr (for "peer rank R failed: ...").

#include <exception>
#include <string>

namespace gdn::comm {

inline std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace gdn::comm
