// conf-cpp-call: input "<target>:<data>"; calls <target> with <data> and
// returns its output, or, when the call fails (staccato::CallError), returns
// {"error_kind": "<kind name>", "message": "<callee message>"}.
#include <staccato.hpp>

#include <stdexcept>
#include <string>

#include "conf.hpp"

std::string call(staccato::Context& ctx, std::string_view in)
{
    auto colon = in.find(':');
    if (colon == std::string_view::npos || colon == 0)
        throw std::invalid_argument("input must be <target>:<data>");
    try {
        return ctx.call(in.substr(0, colon), in.substr(colon + 1));
    } catch (const staccato::CallError& e) {
        return "{\"error_kind\": " + conf::json_string(e.kind()) + ", \"message\": " + conf::json_string(e.what()) +
               "}";
    }
}

STACCATO_HANDLER(call)
