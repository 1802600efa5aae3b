// safetensors reader/writer: round trips, zero-copy and range reads, and every malformed file
// (truncated, header past the end, overlapping / out-of-range offsets, unknown dtype, shape
// mismatch) rejected with an error naming the file and the tensor.
#include <gtest/gtest.h>

#include <fstream>

#include "alpaca/io/safetensors.h"
#include "alpaca/util/error.h"
#include "test_util.h"

namespace test_safetensors {

using namespace alpaca;
namespace fs = std::filesystem;

namespace {

// Writes a raw safetensors file: the 8-byte length, `header`, then `data_bytes` zero bytes.
std::string raw_file(const fs::path& dir, const std::string& name, const std::string& header, size_t data_bytes,
                     int64_t declared_len = -1) {
  const std::string path = (dir / name).string();
  std::ofstream out(path, std::ios::binary);
  uint64_t n = declared_len >= 0 ? static_cast<uint64_t>(declared_len) : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header << std::string(data_bytes, '\0');
  return path;
}

void expect_open_error(const std::string& path, std::initializer_list<std::string> needles) {
  try {
    io::SafetensorsFile::open(path);
    FAIL() << "no error opening " << path;
  } catch (const alpaca::Error& e) {
    EXPECT_NE(e.message().find(path), std::string::npos) << "error does not name the file: " << e.message();
    for (const auto& n : needles) EXPECT_NE(e.message().find(n), std::string::npos) << e.message();
  }
}

TEST(Safetensors, RoundTripsDtypesAndMetadata) {
  alpaca::testing::TempDir tmp("st_roundtrip");
  const std::string path = (tmp.path() / "a.safetensors").string();
  std::vector<std::pair<std::string, at::Tensor>> ts = {
      {"f32", at::randn({3, 5})},
      {"bf16", at::randn({7}).to(at::kBFloat16)},
      {"i64", at::arange(6, at::kLong).view({2, 3})},
      {"scalar", at::tensor(2.5f).reshape({})},
      {"empty", at::zeros({0, 4})},
      {"f16_odd", at::randn({3}).to(at::kHalf)}};
  io::write_safetensors(path, ts, {{"note", "hi"}});
  auto f = io::SafetensorsFile::open(path);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->metadata().at("note"), "hi");
  EXPECT_EQ(f->names().size(), ts.size());
  for (const auto& [name, t] : ts) {
    at::Tensor got = f->tensor(name);
    EXPECT_EQ(got.scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(at::equal(got, t)) << name;
  }
  EXPECT_EQ(f->info("bf16").nbytes(), 14);
  // Range read = the flat slice; writing into a view never reaches the file.
  EXPECT_TRUE(at::equal(f->tensor_range("f32", 4, 6), ts[0].second.reshape({-1}).narrow(0, 4, 6)));
  f->tensor("f32").fill_(7);
  EXPECT_TRUE(at::equal(io::SafetensorsFile::open(path)->tensor("f32"), ts[0].second));
  EXPECT_THROW(f->tensor_range("f32", 10, 6), alpaca::Error);
  EXPECT_THROW(f->info("nope"), alpaca::Error);
}

TEST(Safetensors, TensorIsAZeroCopyViewThatOutlivesTheFileObject) {
  alpaca::testing::TempDir tmp("st_view");
  const std::string path = (tmp.path() / "v.safetensors").string();
  at::Tensor t = at::randn({64, 64});
  io::write_safetensors(path, {{"w", t}});
  at::Tensor view;
  {
    auto f = io::SafetensorsFile::open(path);
    view = f->tensor("w");
    at::Tensor again = f->tensor("w");
    EXPECT_EQ(view.data_ptr(), again.data_ptr());  // both point into the mapping
  }
  EXPECT_TRUE(at::equal(view, t));  // the mapping stays alive with the view
}

TEST(Safetensors, PythonReadsOurFileAndWeReadPythons) {
  alpaca::testing::TempDir tmp("st_python");
  const std::string ours = (tmp.path() / "ours.safetensors").string();
  const std::string theirs = (tmp.path() / "theirs.safetensors").string();
  io::write_safetensors(ours, {{"a", at::arange(12, at::kFloat).view({3, 4})}, {"b", at::ones({2}, at::kBFloat16)}});
  const std::string script =
      "import torch,sys; from safetensors.torch import load_file, save_file\n"
      "d=load_file(sys.argv[1]); assert torch.equal(d['a'], torch.arange(12.).view(3,4)); "
      "assert d['b'].dtype==torch.bfloat16 and torch.equal(d['b'].float(), torch.ones(2))\n"
      "save_file({'x': torch.arange(5, dtype=torch.int32), 'y': torch.full((2,3), 1.5)}, sys.argv[2])\n";
  std::ofstream(tmp.path() / "s.py") << script;
  std::string out;
  ASSERT_EQ(alpaca::testing::run_command(alpaca::testing::python() + " " + (tmp.path() / "s.py").string() + " " +
                                             ours + " " + theirs, &out), 0) << out;
  auto f = io::SafetensorsFile::open(theirs);
  EXPECT_TRUE(at::equal(f->tensor("x"), at::arange(5, at::kInt)));
  EXPECT_TRUE(at::equal(f->tensor("y"), at::full({2, 3}, 1.5)));
}

// A file `name`.safetensors of `header` and `data_bytes` bytes of data refuses to open with an
// error naming each of `needles`.
void expect_bad_header(const std::string& name, const std::string& header, size_t data_bytes,
                       std::initializer_list<std::string> needles) {
  alpaca::testing::TempDir tmp("st_bad");
  expect_open_error(raw_file(tmp.path(), name + ".safetensors", header, data_bytes), needles);
}

TEST(Safetensors, RejectsTruncatedFile) {
  alpaca::testing::TempDir tmp("st_bad");
  const std::string path = (tmp.path() / "short.safetensors").string();
  std::ofstream(path, std::ios::binary) << "abc";
  expect_open_error(path, {"truncated"});
  // A whole file cut in the middle of its data.
  const std::string full = (tmp.path() / "full.safetensors").string();
  io::write_safetensors(full, {{"w", at::randn({100})}});
  const auto size = fs::file_size(full);
  fs::resize_file(full, size - 40);
  expect_open_error(full, {"\"w\"", "out of range"});
}

TEST(Safetensors, RejectsHeaderLengthPastTheEnd) {
  alpaca::testing::TempDir tmp("st_bad");
  expect_open_error(raw_file(tmp.path(), "len.safetensors", "{}", 0, 1000), {"header length 1000", "past the end"});
}

TEST(Safetensors, RejectsOverlappingOffsets) {
  expect_bad_header("overlap",
                    R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                    24, {"\"a\"", "\"b\"", "overlap"});
}

TEST(Safetensors, RejectsOutOfRangeOffsets) {
  expect_bad_header("range",
                    R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[16,32]}})",
                    20, {"\"a\"", "out of range"});
}

TEST(Safetensors, RejectsUnknownDtype) {
  expect_bad_header("dtype",
                    R"({"a":{"dtype":"Q4","shape":[4],"data_offsets":[0,16]}})",
                    16, {"\"a\"", "unknown dtype", "Q4"});
}

TEST(Safetensors, RejectsShapeThatDoesNotMatchTheBytes) {
  expect_bad_header("shape", R"({"a":{"dtype":"F32","shape":[5],"data_offsets":[0,16]}})", 16, {"\"a\"", "needs 20"});
}

TEST(Safetensors, RejectsMalformedHeader) {
  alpaca::testing::TempDir tmp("st_bad");
  expect_open_error(raw_file(tmp.path(), "json.safetensors", "{\"a\": [", 0), {"not valid JSON"});
  expect_open_error(raw_file(tmp.path(), "fields.safetensors", R"({"a":{"dtype":"F32"}})", 0),
                    {"\"a\"", "data_offsets"});
}

TEST(Safetensors, StreamingWriterRemovesPartialFileWhenAbandoned) {
  alpaca::testing::TempDir tmp("st_stream");
  const std::string path = (tmp.path() / "s.safetensors").string();
  {
    io::SafetensorsWriter w(path);
    w.add("a", at::ones({3}));
    EXPECT_THROW(w.add("a", at::ones({3})), alpaca::Error);
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(fs::is_empty(tmp.path()));
}

}  // namespace

}  // namespace test_safetensors
