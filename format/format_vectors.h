// Shared by vectors_test.cpp and the kvformat_vectors tool: what the C++ codec
// says about a test vector, and how it encodes a valid vector's spec
// (tests/vectors/index.json; the Python codec wrote the files).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvtier/format/format_error.h"

namespace kvformat {

// "ok" or the reason name for `data` read as `kind` ("chunk", "manifest",
// "record"). For chunks the whole-buffer and streaming verifiers must agree;
// if they do not, the result is "disagree:<a>/<b>" so a test shows both.
std::string vector_verdict(std::string_view kind, std::span<const std::uint8_t> data);

// Encodes a valid vector from its spec with the C++ codec.
Result<std::vector<std::uint8_t>> encode_vector_spec(std::string_view kind,
                                                     const nlohmann::json& spec);

}  // namespace kvformat
