// conf-cpp-fail: throws; the invocation fails with "conformance failure: <input>".
#include <staccato.hpp>

#include <stdexcept>
#include <string>

std::string fail(staccato::Context&, std::string_view in)
{
    throw std::runtime_error("conformance failure: " + std::string(in));
}

STACCATO_HANDLER(fail)
