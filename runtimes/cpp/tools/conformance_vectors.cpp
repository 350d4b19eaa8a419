// conformance_vectors.cpp - the C++ runtime's vector program for the shared
// conformance suite (conformance/README.md, section 1).
//
// Usage: conformance_vectors <testvectors/message_v1.json>
//
// C++ functions are served by the C runtime's host (staccato.hpp is a layer
// over the C API), so the codec their workers use is the C runtime's
// src/wire.c; this program links that very codec and drives it from C++.
// One JSON object per test case and line:
//
//   {"tcId":7,"decoded":true,"fields":{...},"reencoded":"<hex>"}
//   {"tcId":30,"decoded":false,"error":"unknown message kind"}
//
// Exits 0 after printing every case, 1 if the vector file cannot be read.
#include <cjson/cJSON.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "wire.h"

namespace {

constexpr std::array<std::string_view, 9> kind_names = {
    "",         "LauncherHello", "WorkerHello", "CreateWorker", "StopWorker",
    "Dispatch", "Completion",    "Failure",     "Invoke",
};

std::optional<std::vector<std::uint8_t>> unhex(std::string_view hex)
{
    auto val = [](char c) -> int {
        if (c >= '0' && c <= '9')
            return c - '0';
        if (c >= 'a' && c <= 'f')
            return c - 'a' + 10;
        if (c >= 'A' && c <= 'F')
            return c - 'A' + 10;
        return -1;
    };
    if (hex.size() % 2 != 0)
        return std::nullopt;
    std::vector<std::uint8_t> out(hex.size() / 2);
    for (std::size_t i = 0; i < out.size(); i++) {
        int hi = val(hex[2 * i]), lo = val(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return std::nullopt;
        out[i] = static_cast<std::uint8_t>(hi << 4 | lo);
    }
    return out;
}

std::string tohex(const std::uint8_t* p, std::size_t n)
{
    static constexpr char digits[] = "0123456789abcdef";
    std::string s(2 * n, '0');
    for (std::size_t i = 0; i < n; i++) {
        s[2 * i] = digits[p[i] >> 4];
        s[2 * i + 1] = digits[p[i] & 15];
    }
    return s;
}

// A JSON string literal.
std::string quote(std::string_view s)
{
    std::string out = "\"";
    for (char c : s) {
        switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        default:
            if (static_cast<unsigned char>(c) < 0x20) {
                char buf[8];
                std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
                out += buf;
            } else {
                out += c;
            }
        }
    }
    return out + "\"";
}

// Small integers as JSON numbers, u64 fields as decimal strings (the vector
// file's conventions).
std::string fields_json(const stc_header& h, const std::uint8_t* msg)
{
    std::ostringstream f;
    f << "{\"kind\":" << quote(kind_names.at(h.kind)) << ",\"flags\":" << h.flags
      << ",\"payload_len\":" << h.payload_len << ",\"call_id\":" << quote(std::to_string(h.call_id))
      << ",\"parent_call_id\":" << quote(std::to_string(h.parent_call_id)) << ",\"worker_id\":" << h.worker_id
      << ",\"name_len\":" << h.name_len << ",\"error_kind\":" << h.error_kind
      << ",\"deadline_us\":" << quote(std::to_string(h.deadline_us))
      << ",\"send_ts_ns\":" << quote(std::to_string(h.send_ts_ns)) << ",\"aux\":" << h.aux
      << ",\"inline\":" << quote(tohex(msg + STC_HEADER_LEN, stc_inline_used(&h))) << "}";
    return f.str();
}

std::string run_case(const cJSON* tc)
{
    const cJSON* id = cJSON_GetObjectItemCaseSensitive(tc, "tcId");
    const cJSON* hex = cJSON_GetObjectItemCaseSensitive(tc, "msg");
    std::string out = "{\"tcId\":" + std::to_string(cJSON_IsNumber(id) ? static_cast<long long>(id->valuedouble) : 0);
    auto msg = cJSON_IsString(hex) ? unhex(hex->valuestring) : std::nullopt;
    if (!msg)
        return out + ",\"decoded\":false,\"error\":\"malformed msg hex in the vector file\"}";
    stc_header h{};
    stc_wire_status st = stc_decode(msg->data(), msg->size(), &h);
    if (st != STC_WIRE_OK)
        return out + ",\"decoded\":false,\"error\":" + quote(stc_wire_strerror(st)) + "}";
    out += ",\"decoded\":true,\"fields\":" + fields_json(h, msg->data());
    // Re-encode the decoded fields into a dirty buffer: the encoder must
    // write every byte itself.
    std::array<std::uint8_t, STC_MSG_LEN> re;
    re.fill(0xAA);
    st = stc_encode(&h, msg->data() + STC_HEADER_LEN, re.data());
    if (st != STC_WIRE_OK)
        return out + ",\"reencoded\":null,\"error\":" + quote(stc_wire_strerror(st)) + "}";
    return out + ",\"reencoded\":" + quote(tohex(re.data(), re.size())) + "}";
}

} // namespace

int main(int argc, char** argv)
{
    if (argc < 2) {
        std::cerr << "usage: " << argv[0] << " message_v1.json\n";
        return 2;
    }
    std::ifstream in(argv[argc - 1], std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    std::unique_ptr<cJSON, decltype(&cJSON_Delete)> doc(in ? cJSON_Parse(text.str().c_str()) : nullptr,
                                                        cJSON_Delete);
    const cJSON* tests = cJSON_GetObjectItemCaseSensitive(doc.get(), "tests");
    if (!cJSON_IsArray(tests)) {
        std::cerr << argv[0] << ": cannot read test vectors from " << argv[argc - 1] << "\n";
        return 1;
    }
    const cJSON* tc;
    cJSON_ArrayForEach(tc, tests) std::cout << run_case(tc) << '\n';
    std::cout.flush();
    return std::cout ? 0 : 1;
}
