// conf-cpp-echo: output = input (as bytes).
#include <staccato.hpp>

#include <cstdint>
#include <span>
#include <vector>

std::vector<std::uint8_t> echo(staccato::Context&, std::span<const std::byte> in)
{
    auto p = reinterpret_cast<const std::uint8_t*>(in.data());
    return {p, p + in.size()};
}

STACCATO_HANDLER(echo)
