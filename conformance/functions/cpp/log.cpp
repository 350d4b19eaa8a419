// conf-cpp-log: writes "conformance log <input>" through ctx.log; returns "ok".
#include <staccato.hpp>

#include <string>

std::string log_line(staccato::Context& ctx, std::string_view in)
{
    ctx.log("conformance log ", in);
    return "ok";
}

STACCATO_HANDLER(log_line)
