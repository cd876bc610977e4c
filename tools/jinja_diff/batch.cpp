#include <fstream>
#include <iostream>
#include <sstream>
// Renders a JSON array of [template, context] pairs; prints a JSON array of
// outputs ("ERR ..." for errors). Used by rand_diff.py and rand_ws.py.
#include "text/jinja/error.h"
#include "text/jinja/template.h"
using namespace tandem::jinja;
int main(int argc, char** argv) {
  std::ifstream g(argv[1]);
  nlohmann::ordered_json cases = nlohmann::ordered_json::parse(g);
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (auto& c : cases) {
    try {
      Template t(c[0].get<std::string>());
      std::vector<std::pair<std::string, Value>> vars;
      for (auto it = c[1].begin(); it != c[1].end(); ++it)
        vars.emplace_back(it.key(), from_json(it.value()));
      RenderOptions o;
      o.limits.max_steps = 1000000;
      out.push_back(t.render(vars, o));
    } catch (const std::exception& e) {
      out.push_back(std::string("ERR ") + e.what());
    }
  }
  std::cout << out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}
