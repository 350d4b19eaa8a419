// test_handler.cpp - C++ handler for tests/test_cpp.py.  The input picks the
// behaviour (like runtimes/c/tests/test_handler.c):
//
//   !throw:MSG            throw std::runtime_error(MSG)
//   !throwint             throw 42 (not a std::exception)
//   !info                 "call=<hex> parent=<hex> deadline=<us or none> remaining=<us or none>"
//   !log:MSG              ctx.log(MSG) and ctx.log("n=", 42, ...); output "logged"
//   !call:NAME:INPUT      ctx.call(NAME, INPUT); "ok:" + output, or on CallError
//                         "err:<kind>:<code>:<what>"
//   !callbytes:NAME:INPUT the same through the std::span<const std::byte> overload
//   !rethrow:NAME:INPUT   ctx.call(NAME, INPUT) without catching: a failed call
//                         fails this invocation with the CallError's message
//   !async:N:NAME         N calls at once with std::async (inputs "0".."N-1");
//                         output the N results joined with ","
//   !threads:N:NAME       the same with std::thread
//   anything else         echo the input
#include <staccato.hpp>

#include <cstdio>
#include <future>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

std::string hex16(std::uint64_t v)
{
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

// "NAME:REST" -> {NAME, REST}
std::pair<std::string, std::string> split(std::string_view args)
{
    auto colon = args.find(':');
    if (colon == std::string_view::npos)
        throw std::invalid_argument("usage: NAME:ARG");
    return {std::string(args.substr(0, colon)), std::string(args.substr(colon + 1))};
}

std::string join(const std::vector<std::string>& parts)
{
    std::string out;
    for (std::size_t i = 0; i < parts.size(); i++)
        out += (i ? "," : "") + parts[i];
    return out;
}

std::string fan_async(staccato::Context& ctx, int n, const std::string& name)
{
    std::vector<std::future<std::string>> futures;
    for (int i = 0; i < n; i++)
        futures.push_back(std::async(std::launch::async, [&ctx, &name, i] { return ctx.call(name, std::to_string(i)); }));
    std::vector<std::string> outs;
    for (auto& f : futures)
        outs.push_back(f.get());
    return join(outs);
}

std::string fan_threads(staccato::Context& ctx, int n, const std::string& name)
{
    std::vector<std::string> outs(static_cast<std::size_t>(n));
    std::vector<std::thread> threads;
    for (int i = 0; i < n; i++)
        threads.emplace_back([&, i] {
            try {
                outs[static_cast<std::size_t>(i)] = ctx.call(name, std::to_string(i));
            } catch (const staccato::CallError& e) {
                outs[static_cast<std::size_t>(i)] = "err:" + std::string(e.kind());
            }
        });
    for (auto& t : threads)
        t.join();
    return join(outs);
}

} // namespace

std::string handle(staccato::Context& ctx, std::string_view in)
{
    auto arg = [&](std::string_view prefix) { return in.substr(prefix.size()); };
    if (!in.starts_with("!"))
        return std::string(in);
    if (in.starts_with("!throw:"))
        throw std::runtime_error(std::string(arg("!throw:")));
    if (in == "!throwint")
        throw 42;
    if (in == "!info") {
        auto d = ctx.deadline();
        auto r = ctx.remaining();
        std::string out = "call=" + hex16(ctx.call_id()) + " parent=" + hex16(ctx.parent_call_id());
        out += " deadline=" +
               (d ? std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(d->time_since_epoch()).count())
                  : std::string("none"));
        out += " remaining=" + (r ? std::to_string(r->count()) : std::string("none"));
        return out;
    }
    if (in.starts_with("!log:")) {
        ctx.log(arg("!log:"));
        ctx.log("n=", 42, " pi=", 3.5, " s=", std::string("str"));
        return "logged";
    }
    if (in.starts_with("!call:") || in.starts_with("!callbytes:")) {
        bool bytes = in.starts_with("!callbytes:");
        auto [name, input] = split(arg(bytes ? "!callbytes:" : "!call:"));
        try {
            if (bytes)
                return "ok:" + ctx.call(name, std::as_bytes(std::span(input.data(), input.size())));
            return "ok:" + ctx.call(name, input);
        } catch (const staccato::CallError& e) {
            return "err:" + std::string(e.kind()) + ":" + std::to_string(e.code()) + ":" + e.what();
        }
    }
    if (in.starts_with("!rethrow:")) {
        auto [name, input] = split(arg("!rethrow:"));
        return ctx.call(name, input);
    }
    if (in.starts_with("!async:") || in.starts_with("!threads:")) {
        bool async = in.starts_with("!async:");
        auto [count, name] = split(arg(async ? "!async:" : "!threads:"));
        int n = std::stoi(count);
        return async ? fan_async(ctx, n, name) : fan_threads(ctx, n, name);
    }
    return std::string(in);
}

STACCATO_HANDLER(handle)
