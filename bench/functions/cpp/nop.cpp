#include <staccato.hpp>

#include <string>
#include <string_view>

std::string nop(staccato::Context&, std::string_view) { return {}; }

STACCATO_HANDLER(nop)
