// kvtier_read_queue_* (store_abi.h): kvtier_read_chunks calls run one after
// another on a thread of the library's own, so a promotion's read needs no
// caller thread (and no GIL) to start, run or end; the caller polls.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <unordered_map>

#include "fault.h"
#include "kvtier/store_abi.h"

namespace {

constexpr std::uint32_t kKnownFlags =
    KVTIER_READ_STOP_ON_FAILURE | KVTIER_READ_WILLNEED | KVTIER_READ_SAFE_FOLDERS;

struct Ticket {
  kvtier_read_item* items;
  std::size_t count;
  std::uint32_t threads;
  std::uint32_t flags;
  std::int32_t state = KVTIER_TICKET_QUEUED;
  std::int64_t bad = 0;
  double seconds = 0;
};

}  // namespace

struct kvtier_read_queue {
  std::mutex mutex;
  std::condition_variable work;   // a ticket queued, or closing
  std::condition_variable ended;  // a ticket DONE or CANCELLED
  std::deque<std::int64_t> queued;
  std::unordered_map<std::int64_t, Ticket> tickets;
  std::int64_t next = 1;
  bool closing = false;
  std::thread thread;

  void run() {
    std::unique_lock lock(mutex);
    for (;;) {
      work.wait(lock, [&] { return closing || !queued.empty(); });
      if (queued.empty()) return;  // closing, nothing left
      const std::int64_t id = queued.front();
      queued.pop_front();
      Ticket& t = tickets.at(id);  // a node: stays put while others come and go
      t.state = KVTIER_TICKET_RUNNING;
      lock.unlock();
      storeio::wait_while_held(t.count > 0 ? t.items[0].path : nullptr);
      const auto start = std::chrono::steady_clock::now();
      const std::int64_t bad = kvtier_read_chunks(t.items, t.count, t.threads, t.flags);
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
      lock.lock();
      t.bad = bad;
      t.seconds = took.count();
      t.state = KVTIER_TICKET_DONE;
      ended.notify_all();
    }
  }

  std::int32_t report(std::int64_t id, std::int64_t* bad, double* seconds) {
    const auto it = tickets.find(id);
    if (it == tickets.end()) return KVTIER_TICKET_UNKNOWN;
    if (it->second.state == KVTIER_TICKET_DONE) {
      if (bad) *bad = it->second.bad;
      if (seconds) *seconds = it->second.seconds;
    }
    return it->second.state;
  }
};

namespace {

bool has_ended(std::int32_t state) {
  return state == KVTIER_TICKET_DONE || state == KVTIER_TICKET_CANCELLED ||
         state == KVTIER_TICKET_UNKNOWN;
}

}  // namespace

extern "C" {

kvtier_read_queue* kvtier_read_queue_new(void) {
  auto* q = new (std::nothrow) kvtier_read_queue;
  if (!q) return nullptr;
  try {
    q->thread = std::thread([q] { q->run(); });
  } catch (...) {  // no thread: the caller refuses the tier, never reads inline
    delete q;
    return nullptr;
  }
  return q;
}

int64_t kvtier_read_queue_submit(kvtier_read_queue* q, kvtier_read_item* items, size_t count,
                                 uint32_t threads, uint32_t flags) {
  if (!q || (flags & ~kKnownFlags) || (count > 0 && !items)) return -1;
  std::lock_guard lock(q->mutex);
  if (q->closing) return -1;
  try {
    const std::int64_t id = q->next++;
    q->tickets.emplace(id, Ticket{items, count, threads, flags});
    q->queued.push_back(id);
    q->work.notify_one();
    return id;
  } catch (...) {  // allocation failure: never across the C ABI
    return -1;
  }
}

int32_t kvtier_read_queue_poll(kvtier_read_queue* q, int64_t ticket, int64_t* bad,
                               double* seconds) {
  if (!q) return KVTIER_TICKET_UNKNOWN;
  std::lock_guard lock(q->mutex);
  return q->report(ticket, bad, seconds);
}

int32_t kvtier_read_queue_wait(kvtier_read_queue* q, int64_t ticket, int64_t timeout_ms,
                               int64_t* bad, double* seconds) {
  if (!q) return KVTIER_TICKET_UNKNOWN;
  std::unique_lock lock(q->mutex);
  const auto ended = [&] { return has_ended(q->report(ticket, nullptr, nullptr)); };
  if (timeout_ms < 0)
    q->ended.wait(lock, ended);
  else
    q->ended.wait_for(lock, std::chrono::milliseconds(timeout_ms), ended);
  return q->report(ticket, bad, seconds);
}

int32_t kvtier_read_queue_cancel(kvtier_read_queue* q, int64_t ticket) {
  if (!q) return KVTIER_TICKET_UNKNOWN;
  std::lock_guard lock(q->mutex);
  const auto it = q->tickets.find(ticket);
  if (it == q->tickets.end()) return KVTIER_TICKET_UNKNOWN;
  if (it->second.state == KVTIER_TICKET_QUEUED) {
    std::erase(q->queued, ticket);
    it->second.state = KVTIER_TICKET_CANCELLED;
    q->ended.notify_all();
  }
  return it->second.state;
}

void kvtier_read_queue_forget(kvtier_read_queue* q, int64_t ticket) {
  if (!q) return;
  std::lock_guard lock(q->mutex);
  const auto it = q->tickets.find(ticket);
  if (it != q->tickets.end() && has_ended(it->second.state)) q->tickets.erase(it);
}

void kvtier_read_queue_free(kvtier_read_queue* q) {
  if (!q) return;
  {
    std::lock_guard lock(q->mutex);
    q->closing = true;
    for (const std::int64_t id : q->queued) q->tickets.at(id).state = KVTIER_TICKET_CANCELLED;
    q->queued.clear();
    q->work.notify_one();
    q->ended.notify_all();
  }
  q->thread.join();
  delete q;
}

void kvtier_store_test_hold_reads(const char* prefix) { storeio::set_read_hold(prefix); }

}  // extern "C"
