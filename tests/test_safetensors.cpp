// safetensors: round trips for every dtype and rank, the exact layout we write, and a clear
// gdn::Error (naming the file and the tensor) for every malformed file.

#include "gdn/safetensors.h"

#include <sys/resource.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gdn/error.h"

namespace gdn {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / (std::string("gdn_test_safetensors_") + info->name() + "_" +
                                        std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static std::string read_file(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  }

  static void write_file(const std::string& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }

  // A file of the given header length field, header text and data bytes.
  std::string make_file(std::uint64_t header_size, const std::string& header,
                        const std::string& data) {
    std::string bytes(8, '\0');
    std::memcpy(bytes.data(), &header_size, 8);
    const std::string p = path("input.safetensors");
    write_file(p, bytes + header + data);
    return p;
  }

  std::string make_file(const std::string& header, const std::string& data) {
    return make_file(header.size(), header, data);
  }

  fs::path dir_;
};

// Expects `read` to throw gdn::Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& read, std::initializer_list<std::string> parts) {
  try {
    read();
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& part : parts)
      EXPECT_NE(message.find(part), std::string::npos)
          << "message \"" << message << "\" lacks \"" << part << "\"";
    return;
  }
  ADD_FAILURE() << "no gdn::Error thrown";
}

HostTensor random_tensor(DType dtype, std::vector<std::int64_t> shape, std::mt19937& rng) {
  HostTensor t = HostTensor::zeros(dtype, std::move(shape));
  for (std::byte& b : t.bytes) b = static_cast<std::byte>(rng());
  return t;
}

TEST_F(Safetensors, RoundTripsEveryDTypeAndRank) {
  const std::vector<std::vector<std::int64_t>> shapes = {{},           {5}, {2, 3},   {2, 1, 3},
                                                         {1, 2, 3, 2}, {0}, {3, 0, 2}};
  std::mt19937 rng(7);
  TensorMap tensors;
  for (DType dtype : {DType::f64, DType::f32, DType::f16, DType::bf16, DType::i64, DType::i32})
    for (std::size_t s = 0; s < shapes.size(); ++s)
      tensors[std::string(dtype_name(dtype)) + ".rank" + std::to_string(shapes[s].size()) + "." +
              std::to_string(s)] = random_tensor(dtype, shapes[s], rng);
  write_safetensors(path("all.safetensors"), tensors);
  const TensorMap back = read_safetensors(path("all.safetensors"));
  ASSERT_EQ(back.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(back.contains(name)) << name;
    const HostTensor& r = back.at(name);
    EXPECT_EQ(r.dtype, t.dtype) << name;
    EXPECT_EQ(r.shape, t.shape) << name;
    EXPECT_EQ(r.bytes, t.bytes) << name;
  }
}

TEST_F(Safetensors, RoundTripsAnEmptyMap) {
  write_safetensors(path("empty.safetensors"), {});
  EXPECT_TRUE(read_safetensors(path("empty.safetensors")).empty());
  EXPECT_EQ(read_file(path("empty.safetensors")).size(), 16u);  // length + "{}" padded to 8
}

TEST_F(Safetensors, WritesTheFormatsLayout) {
  std::mt19937 rng(1);
  TensorMap tensors;
  tensors["model.layers.0.linear_attn.A_log"] = random_tensor(DType::f32, {3}, rng);
  tensors["b"] = random_tensor(DType::bf16, {2, 1}, rng);
  tensors["a"] = random_tensor(DType::i64, {2}, rng);
  write_safetensors(path("layout.safetensors"), tensors);
  const std::string file = read_file(path("layout.safetensors"));

  std::uint64_t header_size = 0;
  std::memcpy(&header_size, file.data(), 8);
  EXPECT_EQ(header_size % 8, 0u);
  EXPECT_EQ(file.size(), 8 + header_size + 16 + 4 + 12);
  const std::string header_text = file.substr(8, header_size);
  const std::size_t last = header_text.find_last_not_of(' ');
  EXPECT_EQ(header_text[last], '}');
  EXPECT_LT(header_size - (last + 1), 8u);  // padding with spaces only, less than 8 of them

  const json header = json::parse(header_text);
  EXPECT_EQ(header.size(), 3u);
  std::int64_t offset = 0;
  const std::string data = file.substr(8 + header_size);
  for (const auto& [name, t] : tensors) {  // name order: a, b, model...
    const json& entry = header.at(name);
    EXPECT_EQ(entry.at("dtype"), name == "a" ? "I64" : name == "b" ? "BF16" : "F32");
    EXPECT_EQ(entry.at("shape").get<std::vector<std::int64_t>>(), t.shape);
    const auto offsets = entry.at("data_offsets").get<std::vector<std::int64_t>>();
    const auto size = static_cast<std::int64_t>(t.bytes.size());
    EXPECT_EQ(offsets, (std::vector<std::int64_t>{offset, offset + size})) << name;
    EXPECT_EQ(std::memcmp(data.data() + offset, t.bytes.data(), t.bytes.size()), 0) << name;
    offset += size;
  }
  EXPECT_EQ(offset, static_cast<std::int64_t>(data.size()));
}

TEST_F(Safetensors, ReadsHandMadeFilesWithMetadataPaddingAndAnyOffsetOrder) {
  // Offsets out of name order, a zero-size tensor, metadata, trailing spaces.
  const float values[2] = {1.5f, -2.0f};
  const std::int32_t ints[2] = {7, -9};
  const std::string data = std::string(reinterpret_cast<const char*>(ints), 8) +
                           std::string(reinterpret_cast<const char*>(values), 8);
  const std::string p = make_file(
      R"({"__metadata__": {"format": "pt"},
          "x": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},
          "y": {"dtype": "I32", "shape": [1, 2], "data_offsets": [0, 8]},
          "z": {"dtype": "F64", "shape": [0, 3], "data_offsets": [8, 8]}}   )",
      data);
  const TensorMap t = read_safetensors(p);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t.at("x").dtype, DType::f32);
  EXPECT_EQ(t.at("x").as<float>()[1], -2.0f);
  EXPECT_EQ(t.at("y").dtype, DType::i32);
  EXPECT_EQ(t.at("y").shape, (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(t.at("y").as<std::int32_t>()[1], -9);
  EXPECT_EQ(t.at("z").shape, (std::vector<std::int64_t>{0, 3}));
  EXPECT_TRUE(t.at("z").bytes.empty());
}

// What the format's reference implementation (huggingface/safetensors) rejects, we reject: a
// name given twice (the last would win), data_offsets that overlap, leave a gap or do not start
// at 0, bytes no tensor covers, a header that does not start with '{' or exceeds 100 MB.
TEST_F(Safetensors, RejectsWhatTheReferenceRejects) {
  struct Case {
    std::string header, expected;
  };
  const std::string x = R"("x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";
  const std::vector<Case> cases = {
      {"{" + x + ", " + x + "}", "header names \"x\" twice in one object"},
      {R"({"x": {"dtype": "F32", "dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
       "header names \"dtype\" twice"},
      {R"({"__metadata__": {"a": "1", "a": "2"}, )" + x + "}", "header names \"a\" twice"},
      {R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
       "tensor \"y\": data_offsets [4, 12] overlap the tensor before it, which ends at 8"},
      {R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "y": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
       "data_offsets [0, 8] overlap"},
      {R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
       "tensor \"x\": data_offsets [4, 8] leave bytes [0, 4) before them unused"},
      {R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
           "y": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
       "leave bytes [4, 8) before them unused"},
      {R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
       "bytes [4, 12) of the 12-byte data buffer are not covered by any tensor"},
      {R"({})", "bytes [0, 12) of the 12-byte data buffer are not covered"},
      {R"( {"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}})",
       "header must start with '{'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    const std::string p = make_file(c.header, std::string(12, '\0'));
    expect_error([&] { read_safetensors(p); }, {p, c.expected});
  }
  // A header length over the limit, in a (sparse) file long enough to hold it.
  const std::string p = make_file(100'000'001, "{", "");
  fs::resize_file(p, 8 + 100'000'001);
  expect_error([&] { read_safetensors(p); }, {p, "exceeds the format's limit of 100000000 bytes"});
}

// SafetensorsFile reads the header only; a tensor's bytes are read when asked for, so a file
// claiming 4 GB costs nothing until then (the file is sparse: it takes no disk either).
TEST_F(Safetensors, ReadsLazily) {
  const std::int64_t big = std::int64_t{1} << 32;
  const std::string header = fmt::format(
      R"({{"big": {{"dtype": "F32", "shape": [{}], "data_offsets": [0, {}]}},
          "small": {{"dtype": "F32", "shape": [2], "data_offsets": [{}, {}]}}}})",
      big / 4, big, big, big + 8);
  const float values[2] = {3.f, 4.f};
  const std::string p = make_file(header, "");
  fs::resize_file(p, 8 + header.size() + static_cast<std::uintmax_t>(big) + 8);
  {
    std::fstream f(p, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(8 + header.size() + static_cast<std::size_t>(big)));
    f.write(reinterpret_cast<const char*>(values), 8);
  }
  const SafetensorsFile file(p);
  EXPECT_EQ(file.entries().size(), 2u);
  EXPECT_EQ(file.entries().at("big").shape, (std::vector<std::int64_t>{big / 4}));
  EXPECT_EQ(file.entries().at("big").end, big);
  EXPECT_TRUE(file.contains("small"));
  EXPECT_FALSE(file.contains("k"));
  const HostTensor small = file.read("small");
  EXPECT_EQ(small.shape, (std::vector<std::int64_t>{2}));
  EXPECT_EQ(small.as<float>()[1], 4.f);
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  EXPECT_LT(usage.ru_maxrss, 512 * 1024) << "KiB of peak memory";
  expect_error([&] { file.read("k"); }, {p, "no tensor \"k\""});
}

// A (sparse) file claiming 8 TiB in one tensor: reading it is a gdn::Error naming the tensor
// and the bytes, not std::bad_alloc.
TEST_F(Safetensors, AHugeTensorIsAnErrorNamingItsBytes) {
  const std::int64_t big = std::int64_t{1} << 43;
  const std::string header = fmt::format(
      R"({{"q": {{"dtype": "F32", "shape": [{}], "data_offsets": [0, {}]}}}})", big / 4, big);
  const std::string p = make_file(header, "");
  fs::resize_file(p, 8 + header.size() + static_cast<std::uintmax_t>(big));
  const SafetensorsFile file(p);
  expect_error([&] { file.read("q"); },
               {p, "tensor \"q\": cannot allocate a tensor of f32", "8796093022208 bytes"});
}

TEST_F(Safetensors, MissingPathNamesThePath) {
  const std::string p = path("no_such.safetensors");
  expect_error([&] { read_safetensors(p); }, {p});
  expect_error([&] { read_safetensors(dir_.string()); }, {dir_.string()});
}

TEST_F(Safetensors, TruncatedFilesNameTheFile) {
  const std::string p = path("short.safetensors");
  write_file(p, std::string("\x10\0\0", 3));
  expect_error([&] { read_safetensors(p); }, {p, "too short"});

  const std::string header = R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})";
  expect_error([&] { read_safetensors(make_file(header.size() + 1, header, "")); },
               {"input.safetensors", "header length"});
  expect_error([&] { read_safetensors(make_file(~std::uint64_t{0}, header, "")); },
               {"input.safetensors", "header length"});
  expect_error([&] { read_safetensors(make_file(header, std::string(7, '\0'))); },
               {"input.safetensors", "\"x\"", "exceed the data buffer of 7 bytes"});
}

TEST_F(Safetensors, MalformedHeadersNameTheFile) {
  for (const std::string header : {"", "{", R"({"x": })", "[1, 2]", "null", "{} x"}) {
    SCOPED_TRACE(header);
    expect_error([&] { read_safetensors(make_file(header, "")); }, {"input.safetensors", "header"});
  }
  for (const std::string metadata : {"1", R"(["pt"])", R"({"format": 1})"}) {
    SCOPED_TRACE(metadata);
    expect_error([&] { read_safetensors(make_file(R"({"__metadata__": )" + metadata + "}", "")); },
                 {"input.safetensors", "__metadata__"});
  }
}

TEST_F(Safetensors, MalformedEntriesNameTheFileAndTheTensor) {
  struct Case {
    std::string entry, expected;
  };
  const std::vector<Case> cases = {
      {R"(3)", "expected an object, got 3"},
      {R"([1])", "expected an object, got array"},
      {R"({"shape": [2], "data_offsets": [0, 8]})", "missing \"dtype\""},
      {R"({"dtype": "F32", "data_offsets": [0, 8]})", "missing \"shape\""},
      {R"({"dtype": "F32", "shape": [2]})", "missing \"data_offsets\""},
      {R"({"dtype": 4, "shape": [2], "data_offsets": [0, 8]})", "dtype must be a string, got 4"},
      {R"({"dtype": "U8", "shape": [8], "data_offsets": [0, 8]})", "dtype \"U8\" is not supported"},
      {R"({"dtype": "f32", "shape": [2], "data_offsets": [0, 8]})",
       "dtype \"f32\" is not supported"},
      {R"({"dtype": "F32", "shape": 2, "data_offsets": [0, 8]})", "shape must be an array, got 2"},
      {R"({"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 8]})",
       "shape[1] must be a non-negative integer, got -1"},
      {R"({"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]})",
       "shape[0] must be a non-negative integer, got 2.0"},
      {R"({"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]})",
       "shape[0] must be a non-negative integer, got \"2\""},
      {R"({"dtype": "F32", "shape": [[[2]]], "data_offsets": [0, 8]})",
       "shape[0] must be a non-negative integer, got array"},
      {R"({"dtype": "F32", "shape": [18446744073709551615], "data_offsets": [0, 8]})",
       "shape[0] must be a non-negative integer"},
      {R"({"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]})",
       "overflows"},
      {R"({"dtype": "I64", "shape": [4611686018427387904], "data_offsets": [0, 8]})", "overflows"},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": 8})", "data_offsets must be [begin, end]"},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": [0, 4, 8]})",
       "data_offsets must be [begin, end]"},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]})",
       "data_offsets must be non-negative integers, got [-8, 0]"},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": [0, null]})",
       "data_offsets must be non-negative integers, got [0, null]"},
      {R"({"dtype": "F32", "shape": [0], "data_offsets": [8, 0]})", "end before begin"},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": [8, 16]})",
       "exceed the data buffer of 8 bytes"},
      {R"({"dtype": "F32", "shape": [2], "data_offsets": [0, 18446744073709551615]})",
       "data_offsets must be non-negative integers"},
      {R"({"dtype": "F32", "shape": [3], "data_offsets": [0, 8]})",
       "span 8 bytes, but F32 [3] needs 12"},
      {R"({"dtype": "F64", "shape": [], "data_offsets": [0, 4]})",
       "span 4 bytes, but F64 [] needs 8"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.entry);
    const std::string p = make_file(R"({"ok": {"dtype": "I32", "shape": [], "data_offsets": [0, 4]},
                                        "bad.tensor": )" +
                                        c.entry + "}",
                                    std::string(8, '\0'));
    expect_error([&] { read_safetensors(p); }, {p, "tensor \"bad.tensor\"", c.expected});
  }
}

TEST_F(Safetensors, WriteRejectsInconsistentTensorsAndNamesThePath) {
  const std::string p = path("out.safetensors");
  TensorMap short_bytes;
  short_bytes["x"] = HostTensor::zeros(DType::f32, {2, 3});
  short_bytes["x"].bytes.pop_back();
  expect_error([&] { write_safetensors(p, short_bytes); }, {p, "\"x\"", "holds 23 bytes"});

  TensorMap negative;
  negative["y"] = HostTensor{DType::f32, {-1}, {}};
  expect_error([&] { write_safetensors(p, negative); }, {p, "\"y\"", "negative"});

  TensorMap reserved;
  reserved["__metadata__"] = HostTensor::zeros(DType::f32, {1});
  expect_error([&] { write_safetensors(p, reserved); }, {p, "__metadata__"});

  const std::string unwritable = path("no_such_dir/out.safetensors");
  expect_error([&] { write_safetensors(unwritable, {}); }, {unwritable});
}

}  // namespace
}  // namespace gdn
