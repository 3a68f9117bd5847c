// The kvstore CLI's own value checks for CLI11 (seconds, whole numbers):
// CLI layer only, moved out of main.cpp so that it stays one idea a file.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

// Seconds from 0 to `max` (decimal only; `max_text` is how the bound prints).
CLI::Validator seconds_up_to(double max, const std::string& max_text);
// A whole number in decimal digits; a negative one says it must be >= min.
CLI::Validator whole_number(int min);
