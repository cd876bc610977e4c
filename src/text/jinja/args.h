// Binds call arguments (positional then keyword) to a builtin's parameter
// names, with Python's errors for extra or unknown arguments.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "core/error.h"
#include "text/jinja/pyfmt.h"
#include "text/jinja/value.h"

namespace tandem::jinja {

class Params {
 public:
  Params(const CallArgs& a, std::initializer_list<const char*> names, const std::string& fname) {
    names_.assign(names.begin(), names.end());
    v_.assign(names_.size(), nullptr);
    if (a.pos.size() > names_.size())
      fail("%s() takes at most %zu argument(s) (%zu given)", fname.c_str(), names_.size(),
           a.pos.size());
    for (size_t k = 0; k < a.pos.size(); ++k) v_[k] = &a.pos[k];
    for (const auto& kv : a.kw) {
      size_t k = 0;
      while (k < names_.size() && kv.first != names_[k]) ++k;
      if (k == names_.size())
        fail("%s() got an unexpected keyword argument '%s'", fname.c_str(), kv.first.c_str());
      if (v_[k])
        fail("%s() got multiple values for argument '%s'", fname.c_str(), kv.first.c_str());
      v_[k] = &kv.second;
    }
  }
  // Null when not given.
  const Value* operator[](size_t k) const { return v_[k]; }
  bool has(size_t k) const { return v_[k] && !v_[k]->is_undefined(); }
  const Value& get(size_t k, const Value& dflt) const { return v_[k] ? *v_[k] : dflt; }

 private:
  std::vector<const char*> names_;
  std::vector<const Value*> v_;
};

inline int64_t int_arg(const Value& v, const char* what) {
  if (v.kind == Kind::Int || v.kind == Kind::Bool) return v.as_int();
  fail("'%s' object cannot be interpreted as an integer (%s)", type_name(v), what);
}

inline const std::string& str_arg(const Value& v, const char* what) {
  if (!v.is_string()) fail("%s must be str, not %s", what, type_name(v));
  return v.s;
}

}  // namespace tandem::jinja
