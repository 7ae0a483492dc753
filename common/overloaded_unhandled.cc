// Compiled by the overloaded_refuses_unhandled test (common/CMakeLists.txt),
// which passes only if the compiler refuses it with Unhandled's message:
// the visit below has no handler for Third. With -DSWARM_ALL_HANDLED it has
// one, and must compile (overloaded_accepts_handled).
#include <variant>

#include "common/overloaded.h"

namespace {
struct First {};
struct Second {};
struct Third {};
}  // namespace

int main() {
  std::variant<First, Second, Third> kind = Third{};
  int handled = 0;
  std::visit(swarm::Overloaded{
                 [&](First&) { handled = 1; },
                 [&](Second&) { handled = 2; },
#ifdef SWARM_ALL_HANDLED
                 [&](Third&) { handled = 3; },
#endif
                 swarm::Unhandled{},
             },
             kind);
  return handled == 3 ? 0 : 1;
}
