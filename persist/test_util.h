// Helpers for tests that use files: a scratch directory and raw writes.
#ifndef SWARM_PERSIST_TEST_UTIL_H_
#define SWARM_PERSIST_TEST_UTIL_H_

#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "gtest/gtest.h"

namespace swarm::persist::testutil {

// A fresh directory under the test temp dir, removed with its contents on
// destruction.
class ScopedTempDir {
 public:
  explicit ScopedTempDir(const std::string& prefix = "swarm_test") {
    std::string pattern = ::testing::TempDir();
    if (pattern.empty() || pattern.back() != '/') pattern += '/';
    pattern += prefix + "_XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp failed for " << pattern;
    }
    path_ = pattern;
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;
  ~ScopedTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }

  const std::string& path() const { return path_; }
  std::string Child(const std::string& name) const {
    return path_ + "/" + name;
  }
  // Writes `contents` to the file `name` in this directory; returns its path.
  std::string Write(const std::string& name, const std::string& contents) const;
  // How many entries the directory holds.
  int CountFiles() const;

 private:
  std::string path_;
};

// Sorted names of the entries of `dir` (empty if it does not exist).
inline std::vector<std::string> ListNames(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Writes `contents` to `path` non-atomically (test setup).
inline void WriteRaw(const std::string& path, const std::string& contents) {
  FILE* f = fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(fwrite(contents.data(), 1, contents.size(), f), contents.size());
  ASSERT_EQ(fclose(f), 0);
}

inline std::string ScopedTempDir::Write(const std::string& name,
                                        const std::string& contents) const {
  const std::string file = Child(name);
  FILE* f = fopen(file.c_str(), "wb");
  EXPECT_NE(f, nullptr) << file;
  if (f == nullptr) return file;
  EXPECT_EQ(fwrite(contents.data(), 1, contents.size(), f), contents.size());
  EXPECT_EQ(fclose(f), 0);
  return file;
}

inline int ScopedTempDir::CountFiles() const {
  return static_cast<int>(ListNames(path_).size());
}

}  // namespace swarm::persist::testutil

#endif  // SWARM_PERSIST_TEST_UTIL_H_
