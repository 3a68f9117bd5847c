// "Did you mean ...?" for mistyped subcommands and options.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvtier {

// The candidate closest to `word` by edit distance (insert, delete,
// substitute, swap two neighbours), if it is close enough to be a typo:
// at most 1 edit for words up to 4 characters, else at most 2 (or a unique
// prefix of at least 3). Empty when nothing is close.
std::string nearest(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace kvtier
