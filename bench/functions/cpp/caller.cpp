#include <staccato.hpp>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

// Input "<n>:<function>": n sequential internal calls, each timed; returns
// the latencies as n little-endian u32 nanoseconds.
std::string caller(staccato::Context& ctx, std::string_view in) {
    auto colon = in.find(':');
    if (colon == std::string_view::npos) throw std::runtime_error("input must be <n>:<function>");
    long n = std::stol(std::string(in.substr(0, colon)));
    std::string target(in.substr(colon + 1));
    std::string out(static_cast<std::size_t>(n) * 4, '\0');
    for (long i = 0; i < n; i++) {
        auto t0 = std::chrono::steady_clock::now();
        ctx.call(target);
        auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
        auto v = static_cast<std::uint32_t>(ns);
        std::memcpy(out.data() + i * 4, &v, 4);  // x86-64: little-endian
    }
    return out;
}

STACCATO_HANDLER(caller)
