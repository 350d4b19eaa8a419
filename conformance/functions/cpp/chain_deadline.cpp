// conf-cpp-chain-deadline: calls conf-cpp-deadline (input ignored) and
// returns its output unchanged; the callee inherits this call's deadline.
#include <staccato.hpp>

#include <string>

std::string chain_deadline(staccato::Context& ctx, std::string_view)
{
    return ctx.call("conf-cpp-deadline");
}

STACCATO_HANDLER(chain_deadline)
