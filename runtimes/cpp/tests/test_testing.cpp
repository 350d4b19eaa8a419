// test_testing.cpp - a C++ handler (tests/test_handler.cpp) run by
// libstaccato-testing, as a user's unit test would: echo, a thrown
// exception, a call answered by a stub and a CallError from one.
#include <staccato_testing.h>

#include <cstdio>
#include <cstring>
#include <string>

extern "C" int staccato_handle(staccato_ctx*, const std::uint8_t*, std::size_t);

namespace {

int failures = 0;

void check(bool ok, const char* what)
{
    if (!ok) {
        std::fprintf(stderr, "FAILED: %s\n", what);
        failures++;
    }
}

std::string run(const std::string& in, const staccato_test_options& o, int want)
{
    staccato_test_result r;
    int kind = staccato_test_run(staccato_handle, reinterpret_cast<const std::uint8_t*>(in.data()), in.size(), &o, &r);
    check(kind == want, in.c_str());
    std::string out = kind == STACCATO_OK ? std::string(reinterpret_cast<char*>(r.output), r.output_len)
                                          : std::string(r.error ? r.error : "");
    staccato_test_result_free(&r);
    return out;
}

int upper(const std::uint8_t* in, std::size_t len, staccato_result* out, void*)
{
    std::string s(reinterpret_cast<const char*>(in), len);
    for (auto& c : s)
        c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return staccato_fake_reply(out, STACCATO_OK, s.data(), s.size());
}

int overloaded(const std::uint8_t*, std::size_t, staccato_result* out, void*)
{
    return staccato_fake_reply(out, STACCATO_ERR_OVERLOADED, "busy", 4);
}

} // namespace

int main()
{
    staccato_fake_callee callees[] = {{"up", upper, nullptr}, {"busy", overloaded, nullptr}};
    staccato_test_options o{};
    o.function = "cpp";
    o.callees = callees;
    o.n_callees = 2;
    check(run("plain", o, STACCATO_OK) == "plain", "echo");
    check(run("!throw:boom", o, STACCATO_ERR_FUNCTION_ERROR) == "boom", "a thrown exception is the error");
    check(run("!call:up:abc", o, STACCATO_OK) == "ok:ABC", "a call answered by a stub");
    std::string busy = run("!call:busy:x", o, STACCATO_OK);
    check(busy.rfind("err:overloaded:14:", 0) == 0, busy.c_str());
    std::printf("libstaccato-testing from C++: %s\n", failures ? "FAILED" : "ok");
    return failures != 0;
}
