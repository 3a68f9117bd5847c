// Test-only: one chunk file on disk and the read item that expects it
// (read_chunks_test, read_queue_test).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/format/crc32.h"
#include "kvtier/store_abi.h"
#include "test_chunk_builder.h"
#include "test_files.h"

namespace storeio::testing {

using kvformat::testing::make_chunk;
using kvformat::testing::pattern_bytes;
using kvformat::testing::state_header;

// A read item that expects the file at `path` to be the chunk `header`
// describes (its segments as the ABI's), landing in `runs`.
inline kvtier_read_item read_item(const kvformat::ChunkHeader& header,
                                  const std::vector<kvtier_segment>& segments,
                                  const char* path, const kvtier_run* runs,
                                  std::uint32_t num_runs) {
  kvtier_read_item it{};
  it.path = path;
  it.fd = -1;
  it.group = header.group;
  it.namespace_hash = header.namespace_hash.data();
  it.key_hash = header.key_hash.data();
  it.key_hash_length = static_cast<std::uint32_t>(header.key_hash.size());
  it.num_segments = static_cast<std::uint32_t>(segments.size());
  it.segments = segments.data();
  it.boundary = header.boundary;
  it.payload_length = header.payload_length;
  it.payload_checksum = header.payload_checksum;
  it.num_runs = num_runs;
  it.runs = runs;
  return it;
}

// One chunk on disk, the item that expects it, and three destination runs
// of uneven sizes (the payload scattered as the restore's CPU rows take it).
struct Fixture {
  ScratchDir dir;
  kvformat::ChunkHeader header = state_header(5000);
  std::vector<std::uint8_t> payload = pattern_bytes(header.payload_length, 4);
  std::vector<std::uint8_t> file;
  std::string path = dir.file("chunk.bin");
  std::vector<kvtier_segment> segments;
  std::vector<std::uint8_t> dest_a, dest_b, dest_c;
  std::vector<kvtier_run> runs;
  kvtier_read_item item{};

  Fixture() {
    header.payload_checksum = kvformat::crc32(payload);
    file = make_chunk(header, payload);
    write_file(path, file);
    segments = abi_segments(header.segments);
    dest_a.assign(7, 0);
    dest_b.assign(payload.size() - 7 - 1000, 0);
    dest_c.assign(1000, 0);
    runs = {{reinterpret_cast<std::uint64_t>(dest_a.data()), dest_a.size()},
            {reinterpret_cast<std::uint64_t>(dest_b.data()), dest_b.size()},
            {reinterpret_cast<std::uint64_t>(dest_c.data()), dest_c.size()}};
    item = expect(path.c_str());
  }

  kvtier_read_item expect(const char* p) {
    return read_item(header, segments, p, runs.data(), static_cast<std::uint32_t>(runs.size()));
  }

  std::vector<std::uint8_t> landed() const {
    std::vector<std::uint8_t> out(dest_a);
    out.insert(out.end(), dest_b.begin(), dest_b.end());
    out.insert(out.end(), dest_c.begin(), dest_c.end());
    return out;
  }

  // Reads the item alone; its reason ("" when OK).
  std::string read(std::uint32_t threads = 1) {
    const auto failed = kvtier_read_chunks(&item, 1, threads, 0);
    EXPECT_EQ(failed, item.status == KVTIER_OK ? 0 : 1);
    return item.reason;
  }
};

}  // namespace storeio::testing
