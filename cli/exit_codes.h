// One exit-code table for both tools and the docker/ scripts (README,
// "Exit codes"): a number means the same thing wherever it appears.
#pragma once

namespace kvtier::exit_code {

constexpr int kOk = 0;           // done; the state is as expected
constexpr int kNotExpected = 1;  // consistent but not as asked: check's state, verify/gc findings, invalid chunk
constexpr int kUsage = 2;        // bad command line or bad input; nothing written (the gate: every refusal)
constexpr int kDrift = 3;        // overlay: a pin or anchor does not match the tree
constexpr int kUnsafe = 4;       // refused for safety: tampered/half-applied tree, sweep refused
constexpr int kCompile = 5;      // overlay --check-injected: an injected source does not compile
constexpr int kIo = 6;           // an I/O error (unreadable, read-only, disk full)
constexpr int kBusy = 7;         // another process holds the lock (overlay's tree, kvstore's store)
constexpr int kNoStore = 8;      // kvstore: ROOT holds no store

}  // namespace kvtier::exit_code
