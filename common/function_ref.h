// A non-owning reference to a callable, for callbacks on hot paths: std::function copies a capturing
// lambda onto the heap when it outgrows its small buffer (the tensor-parallel sums' callback did, twice per
// layer and decoded token). The callable must outlive the FunctionRef (pass it down a call, never store it).
#pragma once

#include <concepts>
#include <memory>
#include <type_traits>
#include <utility>

namespace shardline {

template <typename Signature>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F>
    requires(!std::same_as<std::remove_cvref_t<F>, FunctionRef> && std::is_invocable_r_v<R, F&, Args...>)
  FunctionRef(F&& f)  // NOLINT(google-explicit-constructor): converts like std::function
      : callable_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* callable, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(callable))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(callable_, std::forward<Args>(args)...); }

 private:
  void* callable_;
  R (*call_)(void*, Args...);
};

}  // namespace shardline
