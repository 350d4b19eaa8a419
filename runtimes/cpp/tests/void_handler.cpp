// void_handler.cpp - a handler returning void: empty output; it logs its input.
#include <staccato.hpp>

#include <string_view>

void sink(staccato::Context& ctx, std::string_view in) { ctx.log("got ", in.size(), " bytes"); }

STACCATO_HANDLER(sink)
