#include <staccato.hpp>

#include <string>
#include <string_view>

// The end of the chain: no further calls.
std::string handle(staccato::Context&, std::string_view in) {
    return "cpp(" + std::string(in) + ")";
}

STACCATO_HANDLER(handle)
