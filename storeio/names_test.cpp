// The name and open calls of the C ABI (store_abi.h, ABI 6): the names
// format/'s layout builds, parsed back part by part; bad_name for what is not
// one; kvtier_open's refusals (a link on the path, with openat2 and with the
// walk; a FIFO with KVTIER_OPEN_REGULAR) as -errno.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>
#include <string>

#include "kvtier/store_abi.h"

namespace {

struct Out {
  std::int32_t status = -1;
  std::string reason;
  std::string data;
};

template <class Call>
Out call(Call&& fn) {
  kvtier_result r{};
  const std::int32_t status = fn(&r);
  Out out{status, r.reason, r.data ? std::string(reinterpret_cast<char*>(r.data), r.length) : ""};
  kvtier_free(r.data);
  return out;
}

Out parse(std::uint32_t kind, const std::string& name) {
  return call([&](kvtier_result* r) { return kvtier_parse_name(kind, name.data(), name.size(), r); });
}

const std::string kKey = "000102030405060708090a0b0c0d0e0f";

TEST(StoreNames, BuildAndParseBack) {
  std::uint8_t ns[32] = {0xfb};
  const std::string prefix = "glm53kv", model = "zai-org/GLM-5.3";
  auto base = call([&](kvtier_result* r) {
    return kvtier_rank_base_name(prefix.data(), prefix.size(), model.data(), model.size(), ns, 7, r);
  });
  ASSERT_EQ(base.status, KVTIER_OK);
  EXPECT_EQ(base.data, "glm53kv_zai-org-GLM-5.3_fb00000000000000_r7");
  EXPECT_EQ(parse(KVTIER_NAME_RANK_BASE, base.data).data,
            "glm53kv\nzai-org-GLM-5.3\nfb00000000000000\n7");

  auto chunk = call([&](kvtier_result* r) { return kvtier_chunk_rel_path(kKey.data(), kKey.size(), 2, r); });
  EXPECT_EQ(chunk.data, "000/10_g2/" + kKey + ".bin");
  EXPECT_EQ(parse(KVTIER_NAME_CHUNK_PATH, chunk.data).data, kKey + "\n2");

  auto manifest = call([&](kvtier_result* r) { return kvtier_manifest_file_name(64, kKey.data(), kKey.size(), r); });
  EXPECT_EQ(manifest.data, "b64_" + kKey + ".json");
  EXPECT_EQ(parse(KVTIER_NAME_MANIFEST, manifest.data).data, "64\n" + kKey);

  auto pending = call([&](kvtier_result* r) { return kvtier_pending_file_name(12, 34, r); });
  EXPECT_EQ(pending.data, "12.34.json");
  EXPECT_EQ(parse(KVTIER_NAME_PENDING, pending.data).data, "12\n34");

  const std::string final_name = "a\nb.json";
  auto temp = call([&](kvtier_result* r) { return kvtier_temp_name(final_name.data(), final_name.size(), 5, 6, r); });
  EXPECT_EQ(temp.data, "a\nb.json.tmp.5.6");
  EXPECT_EQ(parse(KVTIER_NAME_TEMP, temp.data).data, "5\n6\na\nb.json");

  const std::string raw = "  /x__y/ ";
  EXPECT_EQ(call([&](kvtier_result* r) { return kvtier_sanitize_model(raw.data(), raw.size(), r); }).data, "x-y");
  EXPECT_EQ(parse(KVTIER_NAME_KEY_HEX, kKey).status, KVTIER_OK);
}

TEST(StoreNames, RefusalsAreBadName) {
  const std::string bad_prefix = "Glm", model = "m";
  std::uint8_t ns[32] = {};
  for (const Out& out : {
           call([&](kvtier_result* r) {
             return kvtier_rank_base_name(bad_prefix.data(), bad_prefix.size(), model.data(), 1, ns, 0, r);
           }),
           call([&](kvtier_result* r) {
             return kvtier_rank_base_name("glm", 3, model.data(), 1, ns, 65536, r);
           }),
           call([&](kvtier_result* r) { return kvtier_chunk_rel_path(kKey.data(), kKey.size(), 1024, r); }),
           call([&](kvtier_result* r) { return kvtier_chunk_rel_path("abc", 3, 0, r); }),
           call([&](kvtier_result* r) { return kvtier_manifest_file_name(0, kKey.data(), kKey.size(), r); }),
           call([&](kvtier_result* r) { return kvtier_pending_file_name(0, 1, r); }),
           parse(KVTIER_NAME_KEY_HEX, "ABCDEF0123456789"),
           parse(KVTIER_NAME_RANK_BASE, "glm53kv_m_fb00000000000000_r65536"),
           parse(KVTIER_NAME_CHUNK_PATH, "001/10_g2/" + kKey + ".bin"),
           parse(KVTIER_NAME_MANIFEST, "b0_" + kKey + ".json"),
           parse(KVTIER_NAME_PENDING, "01.2.json"),
           parse(KVTIER_NAME_TEMP, "x.tmp.0.1"),
       }) {
    EXPECT_EQ(out.status, KVTIER_E_FORMAT);
    EXPECT_EQ(out.reason, "bad_name");
    EXPECT_EQ(out.data, "");
  }
  EXPECT_EQ(parse(99, "x").status, KVTIER_E_ARGUMENT);
  EXPECT_EQ(kvtier_parse_name(KVTIER_NAME_TEMP, nullptr, 1, nullptr), KVTIER_E_ARGUMENT);
}

class StoreOpen : public ::testing::TestWithParam<std::uint32_t> {};

TEST_P(StoreOpen, RefusesLinksAndNonRegularFiles) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("kvtier_open_" + std::to_string(::getpid()) +
                                                    "_" + std::to_string(GetParam()));
  fs::remove_all(dir);
  fs::create_directories(dir / "real" / "leaf");
  { std::FILE* f = std::fopen((dir / "real/leaf/f").c_str(), "w"); std::fputs("bytes", f); std::fclose(f); }
  fs::create_directory_symlink(dir / "real", dir / "link");
  fs::create_symlink(dir / "real/leaf/f", dir / "real/leaf/flink");
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  const std::uint32_t walk = GetParam();

  const int fd = kvtier_open((dir / "real/leaf/f").c_str(), O_RDONLY, 0, walk | KVTIER_OPEN_REGULAR);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(::fcntl(fd, F_GETFD) & FD_CLOEXEC);
  ::close(fd);
  for (const char* linked : {"link/leaf/f", "link/leaf", "link", "real/leaf/flink"})
    EXPECT_EQ(kvtier_open((dir / linked).c_str(), O_RDONLY, 0, walk), -ELOOP) << linked;
  EXPECT_EQ(kvtier_open((dir / "real/missing").c_str(), O_RDONLY, 0, walk), -ENOENT);
  EXPECT_EQ(kvtier_open((dir / "fifo").c_str(), O_RDONLY | O_NONBLOCK, 0, walk | KVTIER_OPEN_REGULAR),
            -EINVAL);
  EXPECT_EQ(kvtier_open((dir / "real").c_str(), O_RDONLY, 0, walk | KVTIER_OPEN_REGULAR), -EINVAL);
  const int made = kvtier_open((dir / "real/new").c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600, walk);
  ASSERT_GE(made, 0);
  ::close(made);
  struct stat st {};
  ASSERT_EQ(::stat((dir / "real/new").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(kvtier_open(nullptr, O_RDONLY, 0, walk), -EINVAL);
  EXPECT_EQ(kvtier_open((dir / "real/leaf/f").c_str(), O_RDONLY, 0, 1u << 20), -EINVAL);
  fs::remove_all(dir);
}

TEST(StoreKeyFile, LoadsAPrivateKeyAndNamesEachRefusal) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("kvtier_key_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "store");
  auto write_key = [](const fs::path& p, mode_t mode, std::size_t n = 32) {
    std::FILE* f = std::fopen(p.c_str(), "w");
    for (std::size_t i = 0; i < n; ++i) std::fputc(static_cast<int>(i + 1), f);
    std::fclose(f);
    ::chmod(p.c_str(), mode);
  };
  auto load = [](const fs::path& p, const char* store = nullptr) {
    kvtier_result r{};
    const std::int32_t status = kvtier_load_key(p.c_str(), store, &r);
    Out out{status, r.reason, r.data ? std::string(reinterpret_cast<char*>(r.data), r.length) : ""};
    if (status != KVTIER_OK) EXPECT_EQ(out.data.substr(0, 40), std::string(r.message).substr(0, 40));
    kvtier_free(r.data);
    return out;
  };
  write_key(dir / "key", 0600);
  const Out ok = load(dir / "key");
  ASSERT_EQ(ok.status, KVTIER_OK);
  ASSERT_EQ(ok.data.size(), 32u);
  EXPECT_EQ(ok.data[0], 1);

  write_key(dir / "open", 0640);
  write_key(dir / "short", 0600, 31);
  write_key(dir / "store" / "key", 0600);
  fs::create_symlink(dir / "key", dir / "link");
  const std::string store = (dir / "store").string();
  for (auto [path, problem] : {std::pair{dir / "open", std::string("has mode 0640")},
                               {dir / "short", "holds 31 bytes"},
                               {dir / "link", "is a symlink"},
                               {dir / "missing", "No such file"},
                               {dir / "store" / "key", "inside the store folder"}}) {
    const Out out = load(path, store.c_str());
    EXPECT_EQ(out.status, KVTIER_E_UNSAFE) << path;
    EXPECT_EQ(out.reason, "unsafe_key_file");
    EXPECT_NE(out.data.find("key file " + path.string()), std::string::npos) << out.data;
    EXPECT_NE(out.data.find(problem), std::string::npos) << out.data;
  }
  // A path too long for the message: data still holds the problem.
  fs::path deep = dir;
  for (int i = 0; i < 6; ++i) deep /= std::string(50, 'd');
  fs::create_directories(deep);
  write_key(deep / "key", 0644);
  const Out long_path = load(deep / "key");
  EXPECT_GT(long_path.data.size(), std::size_t{KVTIER_MESSAGE_BYTES});
  EXPECT_NE(long_path.data.find("(chmod 600)"), std::string::npos);
  EXPECT_EQ(kvtier_load_key(nullptr, nullptr, nullptr), KVTIER_E_ARGUMENT);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(OpenAt2AndWalk, StoreOpen, ::testing::Values(0u, KVTIER_OPEN_WALK));

}  // namespace
