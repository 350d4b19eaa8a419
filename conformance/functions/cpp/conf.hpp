// conf.hpp - helpers shared by the C++ conformance functions.
#ifndef CONF_HPP
#define CONF_HPP

#include <cstdio>
#include <string>
#include <string_view>

namespace conf {

// A JSON string literal (bytes >= 0x80 copied as they are).
inline std::string json_string(std::string_view s)
{
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (static_cast<unsigned char>(c) < 0x20) {
            char esc[8];
            std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
            out += esc;
        } else {
            out += c;
        }
    }
    return out + "\"";
}

inline std::string hex16(std::uint64_t v)
{
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

} // namespace conf

#endif
