// staccato.hpp - header-only C++20 API for Staccato functions, over the C API
// of staccato.h.  C++ functions run in the C runtime's host
// (runtimes/c/build/staccato-c-host) like C functions; this header only adds
// types, exceptions and the handler glue.
//
//     #include <staccato.hpp>
//
//     std::string handle(staccato::Context& ctx, std::string_view in)
//     {
//         try {
//             return ctx.call("lower", in);
//         } catch (const staccato::CallError& e) {
//             ctx.log("lower failed: ", e.kind(), ": ", e.what());
//             throw;  // the invocation fails with function_error, message e.what()
//         }
//     }
//     STACCATO_HANDLER(handle)
//
// Build (what the engine does at deploy, from the repository root):
//
//     g++ -std=c++20 -O2 -fPIC -shared -Wall -I runtimes/c/include
//         -I runtimes/cpp/include handler.cpp -o handler.so       (one line)
//
// The handler is `R handle(staccato::Context&, In)` where In is
// std::string_view (or std::span<const std::byte>) and R is the output:
// std::string, anything convertible to std::string_view, a contiguous range
// of 1-byte elements (std::vector<std::uint8_t>, std::vector<std::byte>, ...)
// or void (empty output).  An exception escaping the handler fails the
// invocation (function_error) with e.what() as the message.
//
// Threads: a handler may call ctx.call / ctx.log and the accessors from
// threads of its own (std::thread, std::async) while it runs, e.g. to make
// several internal calls at once; those threads must be finished before the
// handler returns.
#ifndef STACCATO_HPP
#define STACCATO_HPP

#include <staccato.h>

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <iterator>
#include <limits>
#include <optional>
#include <ranges>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace staccato {

// Error kinds (docs/protocol.md, "Error kinds").
enum class ErrorKind : int {
    not_found = STACCATO_ERR_NOT_FOUND,
    payload_too_large = STACCATO_ERR_PAYLOAD_TOO_LARGE,
    function_error = STACCATO_ERR_FUNCTION_ERROR,
    worker_crashed = STACCATO_ERR_WORKER_CRASHED,
    timeout = STACCATO_ERR_TIMEOUT,
    engine_unavailable = STACCATO_ERR_ENGINE_UNAVAILABLE,
    bad_request = STACCATO_ERR_BAD_REQUEST,
    internal = STACCATO_ERR_INTERNAL,
    out_of_memory = STACCATO_ERR_OUT_OF_MEMORY,
    output_too_large = STACCATO_ERR_OUTPUT_TOO_LARGE,
    call_cycle = STACCATO_ERR_CALL_CYCLE,
    call_depth_exceeded = STACCATO_ERR_CALL_DEPTH_EXCEEDED,
    function_removed = STACCATO_ERR_FUNCTION_REMOVED,
    overloaded = STACCATO_ERR_OVERLOADED,
};

// The protocol's name of an error kind code ("not_found", ...), "unknown"
// for a code outside the table.
constexpr std::string_view error_kind_name(int code) noexcept
{
    switch (code) {
    case STACCATO_ERR_NOT_FOUND: return "not_found";
    case STACCATO_ERR_PAYLOAD_TOO_LARGE: return "payload_too_large";
    case STACCATO_ERR_FUNCTION_ERROR: return "function_error";
    case STACCATO_ERR_WORKER_CRASHED: return "worker_crashed";
    case STACCATO_ERR_TIMEOUT: return "timeout";
    case STACCATO_ERR_ENGINE_UNAVAILABLE: return "engine_unavailable";
    case STACCATO_ERR_BAD_REQUEST: return "bad_request";
    case STACCATO_ERR_INTERNAL: return "internal";
    case STACCATO_ERR_OUT_OF_MEMORY: return "out_of_memory";
    case STACCATO_ERR_OUTPUT_TOO_LARGE: return "output_too_large";
    case STACCATO_ERR_CALL_CYCLE: return "call_cycle";
    case STACCATO_ERR_CALL_DEPTH_EXCEEDED: return "call_depth_exceeded";
    case STACCATO_ERR_FUNCTION_REMOVED: return "function_removed";
    case STACCATO_ERR_OVERLOADED: return "overloaded";
    default: return "unknown";
    }
}

// A failed internal call (Context::call): kind() is the error kind name,
// what() the message from the engine or the callee.
class CallError : public std::runtime_error {
public:
    CallError(int code, const std::string& message) : std::runtime_error(message), code_(code) {}

    std::string_view kind() const noexcept { return error_kind_name(code_); }
    int code() const noexcept { return code_; }
    ErrorKind error_kind() const noexcept { return static_cast<ErrorKind>(code_); }

private:
    int code_;
};

namespace detail {

template <class... Args>
inline constexpr bool is_one_string_v = false;
template <class T>
inline constexpr bool is_one_string_v<T> = std::is_convertible_v<const T&, std::string_view>;

// Frees a staccato_result on scope exit.
struct ResultGuard {
    staccato_result r{};
    ResultGuard() = default;
    ResultGuard(const ResultGuard&) = delete;
    ResultGuard& operator=(const ResultGuard&) = delete;
    ~ResultGuard() { staccato_result_free(&r); }
};

} // namespace detail

// The invocation's context: ids, deadline, logging and internal calls.
// Handed to the handler by reference; valid until the handler returns.
class Context {
public:
    using clock = std::chrono::system_clock;

    explicit Context(staccato_ctx* ctx) noexcept : ctx_(ctx) {}
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;

    // This invocation's call id, and its caller's (0 for calls from the gateway).
    std::uint64_t call_id() const noexcept { return staccato_call_id(ctx_); }
    std::uint64_t parent_call_id() const noexcept { return staccato_parent_call_id(ctx_); }

    // The invocation's W3C trace context when it has one (on an engine that
    // traces, --otlp-endpoint): the trace id (32 hex digits), a
    // traceparent naming this invocation's span as the parent (for calls to
    // services outside Staccato), the caller's tracestate; empty when none.
    std::string_view trace_id() const noexcept { return staccato_trace_id(ctx_); }
    std::string_view traceparent() const noexcept { return staccato_traceparent(ctx_); }
    std::string_view tracestate() const noexcept { return staccato_tracestate(ctx_); }

    // Absolute deadline, or nullopt when there is none.
    std::optional<clock::time_point> deadline() const noexcept
    {
        std::int64_t us = staccato_deadline_us(ctx_);
        if (us <= 0)
            return std::nullopt;
        using us_t = std::chrono::microseconds;
        constexpr auto max_us = std::chrono::duration_cast<us_t>(clock::duration::max()).count();
        if (us >= max_us)
            return clock::time_point::max();
        return clock::time_point(std::chrono::duration_cast<clock::duration>(us_t(us)));
    }

    // Time left until the deadline (zero once it has passed), or nullopt.
    std::optional<std::chrono::microseconds> remaining() const noexcept
    {
        std::int64_t us = staccato_remaining_us(ctx_);
        if (us < 0)
            return std::nullopt;
        return std::chrono::microseconds(us);
    }

    // Writes one line "[<function> <call id>] <message>" to the function's log.
    void log(std::string_view message) const
    {
        // staccato_log caps a line at 4 KiB anyway; the cap keeps the int cast safe.
        int len = message.size() > 1u << 20 ? 1 << 20 : static_cast<int>(message.size());
        staccato_log(ctx_, "%.*s", len, message.data() ? message.data() : "");
    }

    // Writes its arguments, streamed one after the other with operator<<,
    // as one log line: ctx.log("took ", ms, " ms").
    template <class... Args>
        requires(sizeof...(Args) > 0 && !detail::is_one_string_v<Args...>)
    void log(const Args&... args) const
    {
        std::ostringstream out;
        (out << ... << args);
        log(std::string_view(out.str()));
    }

    // Calls another function and returns its output.  Throws CallError when
    // the call fails (kind() says how: not_found, function_error, timeout, ...).
    // The callee inherits this invocation's deadline.  Thread-safe: several
    // threads may have calls in flight at once.
    std::string call(std::string_view function, std::string_view input = {}) const
    {
        return call_raw(function, input.data(), input.size());
    }
    std::string call(std::string_view function, std::span<const std::byte> input) const
    {
        return call_raw(function, input.data(), input.size());
    }
    std::string call(std::string_view function, std::span<const std::uint8_t> input) const
    {
        return call_raw(function, input.data(), input.size());
    }

    // The C context, for the staccato_* functions of staccato.h.
    staccato_ctx* native() const noexcept { return ctx_; }

private:
    std::string call_raw(std::string_view function, const void* data, std::size_t len) const
    {
        // staccato_call wants a NUL-terminated name: copy it (no allocation).
        // A name that is too long is passed on at 65 bytes, so the C API
        // rejects it with its usual bad_request message.
        char name[STACCATO_NAME_MAX + 2];
        std::size_t n = function.size() < STACCATO_NAME_MAX + 1 ? function.size() : STACCATO_NAME_MAX + 1;
        if (std::char_traits<char>::find(function.data(), n, '\0') != nullptr)
            throw CallError(STACCATO_ERR_BAD_REQUEST, "function name contains a NUL byte");
        if (n > 0)
            std::memcpy(name, function.data(), n);
        name[n] = '\0';
        detail::ResultGuard res;
        int kind = staccato_call(ctx_, name, data, len, &res.r);
        std::string out(res.r.data ? reinterpret_cast<const char*>(res.r.data) : "", res.r.len);
        if (kind != STACCATO_OK)
            throw CallError(kind, out);
        return out;
    }

    staccato_ctx* ctx_;
};

namespace detail {

template <class T>
concept ByteRange = std::ranges::contiguous_range<const T&> && std::ranges::sized_range<const T&> &&
                    sizeof(std::ranges::range_value_t<T>) == 1 &&
                    std::is_trivially_copyable_v<std::ranges::range_value_t<T>>;

template <class R>
int set_output(staccato_ctx* ctx, const R& out)
{
    if constexpr (std::is_convertible_v<const R&, std::string_view>) {
        std::string_view s = out;
        return staccato_set_output(ctx, s.data(), s.size());
    } else if constexpr (ByteRange<R>) {
        return staccato_set_output(ctx, std::ranges::data(out), std::ranges::size(out));
    } else {
        static_assert(ByteRange<R>, "a Staccato handler must return std::string, std::string_view, "
                                    "a contiguous range of bytes (std::vector<std::uint8_t>, ...) or void");
        return STACCATO_ERR_INTERNAL;
    }
}

template <class F>
decltype(auto) call_handler(F& fn, Context& ctx, const std::uint8_t* input, std::size_t len)
{
    if constexpr (std::is_invocable_v<F&, Context&, std::string_view>) {
        return fn(ctx, std::string_view(reinterpret_cast<const char*>(input), len));
    } else if constexpr (std::is_invocable_v<F&, Context&, std::span<const std::byte>>) {
        return fn(ctx, std::span<const std::byte>(reinterpret_cast<const std::byte*>(input), len));
    } else {
        static_assert(std::is_invocable_v<F&, Context&, std::string_view>,
                      "a Staccato handler takes (staccato::Context&, std::string_view) or "
                      "(staccato::Context&, std::span<const std::byte>)");
    }
}

// Body of the staccato_handle that STACCATO_HANDLER defines.
template <class F>
int run_handler(F& fn, staccato_ctx* c, const std::uint8_t* input, std::size_t len) noexcept
{
    try {
        Context ctx(c);
        using R = decltype(call_handler(fn, ctx, input, len));
        if constexpr (std::is_void_v<R>) {
            call_handler(fn, ctx, input, len);
            return staccato_set_output(c, nullptr, 0);
        } else {
            return set_output(c, call_handler(fn, ctx, input, len));
        }
    } catch (const std::exception& e) {
        staccato_set_error(c, "%s", e.what());
    } catch (...) {
        staccato_set_error(c, "unknown C++ exception");
    }
    return 1;
}

} // namespace detail
} // namespace staccato

// Exports `fn` as the function's entry point: defines the extern "C"
// staccato_handle that the host calls.  Use it once, at namespace scope.
#define STACCATO_HANDLER(fn)                                                                             \
    extern "C" int staccato_handle(staccato_ctx* staccato_ctx_, const std::uint8_t* staccato_input_,    \
                                   std::size_t staccato_input_len_)                                      \
    {                                                                                                    \
        return ::staccato::detail::run_handler(fn, staccato_ctx_, staccato_input_, staccato_input_len_); \
    }

#endif // STACCATO_HPP
