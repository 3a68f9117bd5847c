#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kvtier/store_abi.h"
#include "test_read_fixture.h"

namespace {

using storeio::testing::Fixture;

// Releases every held read when a test ends, pass or fail.
struct Hold {
  explicit Hold(const std::string& prefix) { kvtier_store_test_hold_reads(prefix.c_str()); }
  ~Hold() { kvtier_store_test_hold_reads(nullptr); }
};

struct Queue {
  kvtier_read_queue* q = kvtier_read_queue_new();
  ~Queue() { kvtier_read_queue_free(q); }
};

constexpr std::int32_t kUntouched = 12345;  // a status no call writes

TEST(ReadQueue, ASubmittedReadLandsAndIsDoneWithItsTime) {
  Fixture f;
  Queue queue;
  ASSERT_NE(queue.q, nullptr);
  const std::int64_t ticket = kvtier_read_queue_submit(queue.q, &f.item, 1, 2, 0);
  ASSERT_GT(ticket, 0);
  std::int64_t bad = -7;
  double seconds = -1;
  EXPECT_EQ(kvtier_read_queue_wait(queue.q, ticket, -1, &bad, &seconds), KVTIER_TICKET_DONE);
  EXPECT_EQ(bad, 0);
  EXPECT_GT(seconds, 0);
  EXPECT_EQ(f.item.status, KVTIER_OK);
  EXPECT_EQ(f.landed(), f.payload);
  // Done stays done until forgotten, then the ticket is unknown.
  EXPECT_EQ(kvtier_read_queue_poll(queue.q, ticket, nullptr, nullptr), KVTIER_TICKET_DONE);
  kvtier_read_queue_forget(queue.q, ticket);
  EXPECT_EQ(kvtier_read_queue_poll(queue.q, ticket, nullptr, nullptr), KVTIER_TICKET_UNKNOWN);
}

TEST(ReadQueue, AFailedFileIsCountedInTheTicketsResult) {
  Fixture f;
  f.file[f.file.size() - 1] ^= 1;
  storeio::testing::write_file(f.path, f.file);
  Queue queue;
  const std::int64_t ticket = kvtier_read_queue_submit(queue.q, &f.item, 1, 1, 0);
  std::int64_t bad = 0;
  EXPECT_EQ(kvtier_read_queue_wait(queue.q, ticket, -1, &bad, nullptr), KVTIER_TICKET_DONE);
  EXPECT_EQ(bad, 1);
  EXPECT_STREQ(f.item.reason, "payload_checksum_mismatch");
}

TEST(ReadQueue, CallsRunOneAtATimeInOrderAndAQueuedOneCanBeCancelled) {
  Fixture first, second, third;
  second.item.status = kUntouched;
  Queue queue;
  const auto [a, c] = [&] {
    Hold hold(first.dir.path() + "/");
    const std::int64_t a = kvtier_read_queue_submit(queue.q, &first.item, 1, 1, 0);
    const std::int64_t b = kvtier_read_queue_submit(queue.q, &second.item, 1, 1, 0);
    const std::int64_t c = kvtier_read_queue_submit(queue.q, &third.item, 1, 1, 0);
    // The first is taken and held before its first open; the others wait.
    for (int i = 0; i < 500 && kvtier_read_queue_poll(queue.q, a, nullptr, nullptr) !=
                                   KVTIER_TICKET_RUNNING;
         ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    EXPECT_EQ(kvtier_read_queue_wait(queue.q, a, 50, nullptr, nullptr), KVTIER_TICKET_RUNNING);
    EXPECT_EQ(kvtier_read_queue_poll(queue.q, b, nullptr, nullptr), KVTIER_TICKET_QUEUED);
    EXPECT_EQ(kvtier_read_queue_cancel(queue.q, a), KVTIER_TICKET_RUNNING);  // too late
    EXPECT_EQ(kvtier_read_queue_cancel(queue.q, b), KVTIER_TICKET_CANCELLED);
    EXPECT_EQ(kvtier_read_queue_wait(queue.q, b, -1, nullptr, nullptr), KVTIER_TICKET_CANCELLED);
    EXPECT_GT(c, b);
    kvtier_read_queue_forget(queue.q, a);  // not ended: kept
    EXPECT_EQ(kvtier_read_queue_poll(queue.q, a, nullptr, nullptr), KVTIER_TICKET_RUNNING);
    return std::pair(a, c);
  }();  // released here
  EXPECT_EQ(kvtier_read_queue_wait(queue.q, a, -1, nullptr, nullptr), KVTIER_TICKET_DONE);
  EXPECT_EQ(kvtier_read_queue_wait(queue.q, c, -1, nullptr, nullptr), KVTIER_TICKET_DONE);
  EXPECT_EQ(first.item.status, KVTIER_OK);
  EXPECT_EQ(third.item.status, KVTIER_OK);
  EXPECT_EQ(second.item.status, kUntouched);  // never started
  EXPECT_EQ(second.landed(), std::vector<std::uint8_t>(second.payload.size(), 0));
}

TEST(ReadQueue, AHoldOfAnotherPrefixHoldsNothing) {
  Fixture f, other;
  Queue queue;
  Hold hold(other.dir.path() + "/");
  const std::int64_t t = kvtier_read_queue_submit(queue.q, &f.item, 1, 1, 0);
  EXPECT_EQ(kvtier_read_queue_wait(queue.q, t, 10000, nullptr, nullptr), KVTIER_TICKET_DONE);
}

TEST(ReadQueue, UnusableArgumentsQueueNothing) {
  Fixture f;
  Queue queue;
  EXPECT_EQ(kvtier_read_queue_submit(queue.q, &f.item, 1, 1, 1u << 30), -1);  // unknown flag
  EXPECT_EQ(kvtier_read_queue_submit(queue.q, nullptr, 1, 1, 0), -1);
  EXPECT_EQ(kvtier_read_queue_submit(nullptr, &f.item, 1, 1, 0), -1);
  EXPECT_EQ(kvtier_read_queue_poll(queue.q, 99, nullptr, nullptr), KVTIER_TICKET_UNKNOWN);
  EXPECT_EQ(kvtier_read_queue_cancel(queue.q, 99), KVTIER_TICKET_UNKNOWN);
  kvtier_read_queue_free(nullptr);
}

TEST(ReadQueue, FreeCancelsTheQueuedAndWaitsForTheRunningRead) {
  Fixture running, queued;
  queued.item.status = kUntouched;
  kvtier_read_queue* q = kvtier_read_queue_new();
  kvtier_store_test_hold_reads(running.dir.path().c_str());
  const std::int64_t a = kvtier_read_queue_submit(q, &running.item, 1, 1, 0);
  kvtier_read_queue_submit(q, &queued.item, 1, 1, 0);
  while (kvtier_read_queue_poll(q, a, nullptr, nullptr) != KVTIER_TICKET_RUNNING)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread release([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    kvtier_store_test_hold_reads(nullptr);
  });
  const auto t0 = std::chrono::steady_clock::now();
  kvtier_read_queue_free(q);  // returns only once the running read ended
  const auto took = std::chrono::steady_clock::now() - t0;
  release.join();
  EXPECT_GE(took, std::chrono::milliseconds(150));
  EXPECT_EQ(running.item.status, KVTIER_OK);
  EXPECT_EQ(queued.item.status, kUntouched);
}

}  // namespace
