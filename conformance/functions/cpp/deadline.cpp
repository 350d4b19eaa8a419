// conf-cpp-deadline: the context's fields as JSON
// {"call_id": "<16 hex>", "parent_call_id": "<16 hex>", "deadline_us": N, "remaining_ms": X}.
#include <staccato.hpp>

#include <chrono>
#include <iomanip>
#include <sstream>
#include <string>

#include "conf.hpp"

std::string deadline(staccato::Context& ctx, std::string_view)
{
    using namespace std::chrono;
    auto d = ctx.deadline();
    auto left = ctx.remaining();
    std::ostringstream out;
    out << "{\"call_id\": \"" << conf::hex16(ctx.call_id()) << "\", \"parent_call_id\": \""
        << conf::hex16(ctx.parent_call_id()) << "\", \"deadline_us\": "
        << (d ? duration_cast<microseconds>(d->time_since_epoch()).count() : 0) << ", \"remaining_ms\": ";
    if (left)
        out << std::fixed << std::setprecision(3) << duration<double, std::milli>(*left).count();
    else
        out << "null";
    out << "}";
    return out.str();
}

STACCATO_HANDLER(deadline)
