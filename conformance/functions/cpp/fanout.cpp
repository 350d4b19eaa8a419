// conf-cpp-fanout: 16 internal calls to conf-cpp-echo at once with std::async
// (inputs "0" .. "15"); returns the outputs as a JSON list of strings, in
// input order.  A failed call fails the invocation (its CallError escapes).
#include <staccato.hpp>

#include <future>
#include <string>
#include <vector>

#include "conf.hpp"

std::string fanout(staccato::Context& ctx, std::string_view)
{
    std::vector<std::future<std::string>> calls;
    for (int i = 0; i < 16; i++)
        calls.push_back(std::async(std::launch::async, [&ctx, i] { return ctx.call("conf-cpp-echo", std::to_string(i)); }));
    // Collect every result before rethrowing, so no thread outlives the handler.
    std::vector<std::string> outs;
    std::exception_ptr error;
    for (auto& c : calls) {
        try {
            outs.push_back(c.get());
        } catch (...) {
            if (!error)
                error = std::current_exception();
        }
    }
    if (error)
        std::rethrow_exception(error);
    std::string json = "[";
    for (std::size_t i = 0; i < outs.size(); i++)
        json += (i ? ", " : "") + conf::json_string(outs[i]);
    return json + "]";
}

STACCATO_HANDLER(fanout)
