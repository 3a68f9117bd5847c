#include "format_vectors.h"

#include "kvtier/format/chunk_verifier.h"
#include "kvtier/format/crc32.h"
#include "kvtier/format/header.h"
#include "kvtier/format/layout.h"
#include "kvtier/format/boundary_manifest.h"
#include "kvtier/format/namespace_record.h"
#include "kvtier/format/pending_record.h"

namespace kvformat {
namespace {

using nlohmann::json;

std::string name_of(const Error& e) { return std::string(reason_name(e.reason)); }

std::string chunk_verdict(std::span<const std::uint8_t> data) {
  auto whole = verify_chunk(data);
  const std::string a = whole ? "ok" : name_of(whole.error());
  for (std::size_t block : {1ul, 7ul, 144ul, 4096ul}) {
    ChunkVerifier v(data.size());
    std::string b;
    for (std::size_t pos = 0; pos < data.size() && b.empty(); pos += block) {
      auto r = v.update(data.subspan(pos, std::min(block, data.size() - pos)));
      if (!r) b = name_of(r.error());
    }
    if (b.empty()) {
      auto fin = v.finish();
      b = fin ? "ok" : name_of(fin.error());
    }
    if (a != b) return "disagree:" + a + "/" + b;
  }
  return a;
}

std::vector<std::uint8_t> hex_bytes(const json& v) {
  auto r = from_hex(v.get<std::string>());
  return r ? *r : std::vector<std::uint8_t>{};
}

SegmentKind kind_from(const std::string& s) {
  if (s == "conv") return SegmentKind::Conv;
  if (s == "temporal") return SegmentKind::Temporal;
  return SegmentKind::Kv;
}

DType dtype_from(const std::string& s) {
  for (int d = 1; d <= 9; ++d)
    if (dtype_name(static_cast<DType>(d)) == s) return static_cast<DType>(d);
  return static_cast<DType>(0);
}

}  // namespace

std::string vector_verdict(std::string_view kind, std::span<const std::uint8_t> data) {
  const std::string_view text(reinterpret_cast<const char*>(data.data()), data.size());
  if (kind == "chunk") return chunk_verdict(data);
  if (kind == "manifest") {
    auto r = parse_manifest(text);
    return r ? "ok" : name_of(r.error());
  }
  if (kind == "record") {
    auto r = parse_namespace_record(text);
    return r ? "ok" : name_of(r.error());
  }
  if (kind == "pending") {
    auto r = parse_pending_record(text);
    return r ? "ok" : name_of(r.error());
  }
  return "unknown_kind";
}

Result<std::vector<std::uint8_t>> encode_vector_spec(std::string_view kind, const json& spec) {
  if (kind == "chunk") {
    ChunkHeader h;
    const auto ns = hex_bytes(spec["namespace_hash"]);
    if (ns.size() != h.namespace_hash.size()) return make_error(Reason::BadField, "namespace");
    std::copy(ns.begin(), ns.end(), h.namespace_hash.begin());
    h.group = spec["group"].get<std::uint32_t>();
    h.key_hash = hex_bytes(spec["key_hash"]);
    h.boundary = spec["boundary"].get<std::uint64_t>();
    h.format_version = spec["format_version"].get<std::uint16_t>();
    for (const auto& s : spec["segments"]) {
      h.segments.push_back(Segment{s["layer"].get<std::uint32_t>(),
                                   kind_from(s["kind"].get<std::string>()),
                                   dtype_from(s["dtype"].get<std::string>()),
                                   s["offset"].get<std::uint64_t>(),
                                   s["length"].get<std::uint64_t>(),
                                   s["shape"].get<std::vector<std::uint64_t>>(),
                                   s["stride"].get<std::vector<std::uint64_t>>(),
                                   s["part"].get<std::uint8_t>()});
    }
    const auto payload = hex_bytes(spec["payload"]);
    h.payload_length = payload.size();
    h.payload_checksum = crc32(payload);
    auto bytes = encode_header(h);
    if (!bytes) return bytes;
    bytes->insert(bytes->end(), payload.begin(), payload.end());
    return bytes;
  }
  if (kind == "manifest") {
    BoundaryManifest m;
    m.format = spec["format"].get<std::uint16_t>();
    m.ns = spec["namespace"].get<std::string>();
    m.rank = spec["rank"].get<std::uint32_t>();
    m.boundary = spec["boundary"].get<std::uint64_t>();
    m.chunk_tokens = spec["chunk_tokens"].get<std::uint64_t>();
    m.chain = spec["chain"].get<std::vector<std::string>>();
    for (const auto& g : spec["groups"]) {
      ManifestGroup group{g["group"].get<std::uint32_t>(),
                          g["kind"] == "full" ? GroupKind::Full : GroupKind::State,
                          {}};
      for (const auto& e : g["entries"])
        group.entries.push_back(ManifestEntry{e[0].get<std::string>(), e[1].get<std::uint64_t>(),
                                              e[2].get<std::uint32_t>()});
      m.groups.push_back(std::move(group));
    }
    auto text = encode_manifest(m);
    if (!text) return text.error();
    return std::vector<std::uint8_t>(text->begin(), text->end());
  }
  if (kind == "record") {
    auto text = encode_namespace_record(NamespaceRecord{spec["fenced"], spec["info"]});
    if (!text) return text.error();
    return std::vector<std::uint8_t>(text->begin(), text->end());
  }
  return make_error(Reason::BadField, "unknown vector kind");
}

}  // namespace kvformat
