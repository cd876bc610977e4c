// One error idiom for load time and the API boundary: throw tandem::Error with
// a message that names the file / tensor / flag at fault and states the
// expected and the actual value. Hot paths never throw.
#pragma once

#include <stdexcept>
#include <string>

namespace tandem {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Formats like printf and throws Error.
[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// printf into a std::string.
std::string strprintf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace tandem
