// Exhaustive dispatch over a std::variant (design section 9): every kind of
// event, effect or call has its own handler, and a kind added without one
// fails to compile.
//
//   std::visit(Overloaded{
//                  [](const A& a) { ... },
//                  [](const B& b) { ... },
//                  Unhandled{},  // Last: the catch-all that refuses.
//              },
//              variant);
//
// A handler that takes its alternative by exact type is preferred over
// Unhandled's template, so Unhandled is chosen (and its static_assert fires)
// only for an alternative that has no handler of its own. Take alternatives
// by reference (`A&` or `const A&`), never by a type they convert to: a
// converting handler would be outranked by Unhandled's exact match.
#ifndef SWARM_COMMON_OVERLOADED_H_
#define SWARM_COMMON_OVERLOADED_H_

namespace swarm {

template <typename... Handlers>
struct Overloaded : Handlers... {
  using Handlers::operator()...;
};
template <typename... Handlers>
Overloaded(Handlers...) -> Overloaded<Handlers...>;

// False for every T, but only once T is known (so that the static_assert
// below fires only where Unhandled is chosen).
template <typename T>
inline constexpr bool kNoHandlerFor = false;

struct Unhandled {
  template <typename Alternative>
  void operator()(Alternative&&) const {
    static_assert(kNoHandlerFor<Alternative>,
                  "unhandled alternative: add a handler for this kind");
  }
};

}  // namespace swarm

#endif  // SWARM_COMMON_OVERLOADED_H_
