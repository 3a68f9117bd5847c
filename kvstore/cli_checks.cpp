// See cli_checks.h.
#include "cli_checks.h"

#include <cmath>
#include <cstdlib>
#include <regex>

#include <fmt/format.h>

// Seconds from 0 to max. CLI::Range lets NaN through (every comparison with
// it is false; a NaN grace or lock timeout acted as 0) and prints its bounds
// as 86400.000000.
CLI::Validator seconds_up_to(double max, const std::string& max_text) {
  return CLI::Validator(
      [max, max_text](std::string& s) -> std::string {
        // Decimal only: strtod also reads hex ("0x10" as 16), leading spaces and inf.
        static const std::regex kDecimal(R"(-?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?)");
        if (!std::regex_match(s, kDecimal)) return "not a number: " + s + " (decimal seconds, e.g. 600 or 1.5)";
        char* end = nullptr;
        double v = std::strtod(s.c_str(), &end);
        if (end != s.c_str() + s.size() || !std::isfinite(v)) return "not a number: " + s;
        if (v < 0 || v > max) return "out of range: " + s + " (0 to " + max_text + " seconds)";
        return {};
      },
      "SECONDS");
}

// Decimal digits only: CLI11 read "abc" as out of range and "0x2" as 2. A
// negative whole number is one: say what is wrong with it.
CLI::Validator whole_number(int min) {
  return CLI::Validator(
      [min](std::string& s) -> std::string {
        const bool negative = s.size() > 1 && s[0] == '-';
        const std::string digits = negative ? s.substr(1) : s;
        if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos)
          return "not a whole number: " + s;
        if (negative) return fmt::format("must be >= {}: {}", min, s);
        return {};
      },
      "N");
}
