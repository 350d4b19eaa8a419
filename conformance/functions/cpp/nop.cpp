// conf-cpp-nop: empty output, whatever the input.
#include <staccato.hpp>

void nop(staccato::Context&, std::string_view) {}

STACCATO_HANDLER(nop)
