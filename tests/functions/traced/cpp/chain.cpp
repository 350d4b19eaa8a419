#include <staccato.hpp>

#include <string>
#include <string_view>

// The end of the chain. The values are hex digits, "00-...-01" and a
// tracestate of printable ASCII without quotes or backslashes in the test.
std::string handle(staccato::Context& ctx, std::string_view) {
    auto field = [](std::string_view k, std::string_view v) {
        return "\"" + std::string(k) + "\":\"" + std::string(v) + "\"";
    };
    return "[{" + field("fn", "tr-cpp") + "," + field("trace_id", ctx.trace_id()) + "," +
           field("traceparent", ctx.traceparent()) + "," + field("tracestate", ctx.tracestate()) + "}]";
}

STACCATO_HANDLER(handle)
