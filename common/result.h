// kvtier::Result<T, E>: a value or a typed error, the one return type of every
// library in this repository (the overlay engine, the format codec, kvstore).
// C++20 has no std::expected; this is the small subset we use.
//
// How to use it:
//   * Each library keeps its own error type E (what went wrong, in its own
//     words) and names an alias once, e.g.
//         template <class T> using Result = kvtier::Result<T, Error>;
//         using Status = kvtier::Result<void, Error>;
//   * Return a T or an E; both convert implicitly:
//         Result<int> parse(...) { if (bad) return Error{...}; return 42; }
//         Status write(...)      { if (bad) return Error{...}; return {}; }
//   * Test before use: `if (!r) return r.error();` then `*r` / `r->field`.
//     value() on an error (or error() on a value) is a bug: it throws
//     std::bad_variant_access rather than reading garbage.
//   * The class is [[nodiscard]]: a dropped result is a compiler warning. When
//     ignoring a failure is really right (best-effort cleanup), say why and
//     write `(void)call();`.
// Library code returns Results and never prints; only a CLI turns an error
// into a message and an exit code.
#pragma once

#include <type_traits>
#include <utility>
#include <variant>

namespace kvtier {

template <class T, class E>
class [[nodiscard]] Result {
  static_assert(!std::is_same_v<std::decay_t<T>, std::decay_t<E>>, "value and error types must differ");

 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}
  Result(E error) : v_(std::in_place_index<1>, std::move(error)) {}

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  E& error() & { return std::get<1>(v_); }
  const E& error() const& { return std::get<1>(v_); }
  E&& error() && { return std::get<1>(std::move(v_)); }

 private:
  std::variant<T, E> v_;
};

// Success carries nothing: `return {};` is success, `return E{...};` a failure.
template <class E>
class [[nodiscard]] Result<void, E> {
 public:
  Result() = default;
  Result(E error) : error_(std::in_place_index<1>, std::move(error)) {}

  bool ok() const { return error_.index() == 0; }
  explicit operator bool() const { return ok(); }

  E& error() & { return std::get<1>(error_); }
  const E& error() const& { return std::get<1>(error_); }
  E&& error() && { return std::get<1>(std::move(error_)); }

 private:
  // A variant, not an optional: error() on success throws like value() does.
  struct None {};
  std::variant<None, E> error_{};
};

}  // namespace kvtier
