// vec_handler.cpp - a handler returning std::vector<std::uint8_t> and taking
// its input as bytes: output = input reversed.  "!empty" -> a void handler's
// behaviour is tested with void_handler.cpp.
#include <staccato.hpp>

#include <cstdint>
#include <span>
#include <vector>

std::vector<std::uint8_t> reverse(staccato::Context&, std::span<const std::byte> in)
{
    std::vector<std::uint8_t> out;
    for (auto it = in.rbegin(); it != in.rend(); ++it)
        out.push_back(static_cast<std::uint8_t>(*it));
    return out;
}

STACCATO_HANDLER(reverse)
