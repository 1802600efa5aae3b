// safetensors format: u64 little-endian header length N, N bytes of JSON header
// {"__metadata__": {...}, "<name>": {"dtype", "shape", "data_offsets": [begin, end]}}, then data.
#include "alpaca/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include "alpaca/util/error.h"

namespace alpaca::io {
namespace {

using nlohmann::json;

// safetensors' own limit on the header; a larger value is a corrupt or hostile file.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
// Header space reserved by the writer so data can stream to disk before the header is known.
constexpr int64_t kReservedHeaderBytes = 64 << 10;

const std::vector<std::pair<std::string, at::ScalarType>>& dtype_table() {
  static const std::vector<std::pair<std::string, at::ScalarType>> table = {
      {"F64", at::kDouble}, {"F32", at::kFloat},  {"F16", at::kHalf},  {"BF16", at::kBFloat16},
      {"I64", at::kLong},   {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},
      {"U8", at::kByte},    {"BOOL", at::kBool},  {"F8_E4M3", at::kFloat8_e4m3fn},
      {"F8_E5M2", at::kFloat8_e5m2}};
  return table;
}

std::string errno_text() { return std::strerror(errno); }

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    ALPACA_CHECK(w > 0, path << ": write failed (" << errno_text() << "); check free disk space");
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void pwrite_all(int fd, const void* data, size_t n, off_t off, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, n, off);
    if (w < 0 && errno == EINTR) continue;
    ALPACA_CHECK(w > 0, path << ": write failed (" << errno_text() << "); check free disk space");
    p += w;
    off += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string safetensors_dtype_name(at::ScalarType dtype) {
  for (const auto& [name, t] : dtype_table())
    if (t == dtype) return name;
  ALPACA_FAIL("dtype " << dtype << " cannot be stored in safetensors");
}

at::ScalarType parse_safetensors_dtype(const std::string& name, const std::string& context) {
  for (const auto& [n, t] : dtype_table())
    if (n == name) return t;
  ALPACA_FAIL(context << ": unknown dtype \"" << name
                      << "\" (known: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL F8_E4M3 F8_E5M2)");
}

struct SafetensorsFile::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr && addr != MAP_FAILED) ::munmap(addr, size);
  }
};

SafetensorsFile::~SafetensorsFile() = default;

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ALPACA_CHECK(fd >= 0, path << ": cannot open safetensors file (" << errno_text() << ")");
  struct stat st {};
  int rc = ::fstat(fd, &st);
  const uint64_t file_size = rc == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  if (rc != 0 || file_size < 8) {
    ::close(fd);
    ALPACA_FAIL(path << ": truncated safetensors file (" << file_size
                     << " bytes, shorter than the 8-byte header length); re-download or re-save it");
  }
  f->mapping_ = std::make_shared<Mapping>();
  f->mapping_->size = file_size;
  // Private + writable: pages are shared with the page cache until someone writes to a view,
  // which then gets its own copy instead of a crash or a modified checkpoint.
  f->mapping_->addr = ::mmap(nullptr, file_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  ::close(fd);
  ALPACA_CHECK(f->mapping_->addr != MAP_FAILED, path << ": mmap failed (" << errno_text() << ")");
  const auto* base = static_cast<const uint8_t*>(f->mapping_->addr);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];
  ALPACA_CHECK(header_len <= file_size - 8,
               path << ": header length " << header_len << " runs past the end of the file (" << file_size
                    << " bytes); the file is truncated or not safetensors");
  ALPACA_CHECK(header_len <= kMaxHeaderBytes, path << ": header length " << header_len << " exceeds the 100 MB limit");
  f->data_offset_ = static_cast<int64_t>(8 + header_len);
  const int64_t data_size = static_cast<int64_t>(file_size) - f->data_offset_;

  json header;
  try {
    header = json::parse(reinterpret_cast<const char*>(base + 8), reinterpret_cast<const char*>(base + 8 + header_len));
  } catch (const json::exception& e) {
    ALPACA_FAIL(path << ": header is not valid JSON (" << e.what() << ")");
  }
  ALPACA_CHECK(header.is_object(), path << ": header must be a JSON object");

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& e = it.value();
    if (name == "__metadata__") {
      ALPACA_CHECK(e.is_object(), path << ": __metadata__ must be an object of strings");
      for (auto m = e.begin(); m != e.end(); ++m) {
        ALPACA_CHECK(m.value().is_string(), path << ": __metadata__ value \"" << m.key() << "\" must be a string");
        f->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor \"" + name + "\"";
    ALPACA_CHECK(e.is_object() && e.contains("dtype") && e.contains("shape") && e.contains("data_offsets"),
                 where << " must have dtype, shape and data_offsets");
    ALPACA_CHECK(e["dtype"].is_string(), where << ": dtype must be a string");
    TensorInfo ti;
    ti.name = name;
    ti.file = path;
    ti.dtype = parse_safetensors_dtype(e["dtype"].get<std::string>(), where);
    ALPACA_CHECK(e["shape"].is_array(), where << ": shape must be a list of integers");
    for (const json& d : e["shape"]) {
      ALPACA_CHECK(d.is_number_unsigned(), where << ": shape must hold non-negative integers, got " << e["shape"].dump());
      ti.shape.push_back(d.get<int64_t>());
    }
    const json& off = e["data_offsets"];
    ALPACA_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
                 where << ": data_offsets must be [begin, end] non-negative integers, got " << off.dump());
    ti.data_begin = off[0].get<int64_t>();
    ti.data_end = off[1].get<int64_t>();
    ALPACA_CHECK(ti.data_begin <= ti.data_end, where << ": data_offsets " << off.dump() << " end before they begin");
    ALPACA_CHECK(ti.data_end <= data_size,
                 where << ": data_offsets " << off.dump() << " are out of range: the data section has only "
                       << data_size << " bytes (file truncated or header corrupt)");
    const int64_t expect = ti.numel() * static_cast<int64_t>(c10::elementSize(ti.dtype));
    ALPACA_CHECK(ti.nbytes() == expect, where << ": data_offsets " << off.dump() << " hold " << ti.nbytes()
                                              << " bytes but dtype " << e["dtype"].get<std::string>() << " x shape "
                                              << e["shape"].dump() << " needs " << expect);
    f->tensors_.push_back(std::move(ti));
  }
  std::sort(f->tensors_.begin(), f->tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.data_begin != b.data_begin ? a.data_begin < b.data_begin : a.data_end < b.data_end;
  });
  for (size_t i = 0; i < f->tensors_.size(); ++i) {
    if (i > 0 && f->tensors_[i].nbytes() > 0) {
      // Compare against the last non-empty tensor: empty tensors may share an offset.
      for (size_t j = i; j-- > 0;) {
        if (f->tensors_[j].nbytes() == 0) continue;
        ALPACA_CHECK(f->tensors_[i].data_begin >= f->tensors_[j].data_end,
                     path << ": tensors \"" << f->tensors_[j].name << "\" and \"" << f->tensors_[i].name
                          << "\" overlap in the data section; the file is corrupt");
        break;
      }
    }
    f->index_[f->tensors_[i].name] = i;
  }
  return f;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& t : tensors_) out.push_back(t.name);
  return out;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  ALPACA_CHECK(it != index_.end(), path_ << ": no tensor named \"" << name << "\"");
  return tensors_[it->second];
}

at::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const TensorInfo& ti = info(name);
  return tensor_range(name, 0, ti.numel()).view(ti.shape);
}

at::Tensor SafetensorsFile::tensor_range(const std::string& name, int64_t elem_begin, int64_t elem_count) const {
  const TensorInfo& ti = info(name);
  ALPACA_CHECK(elem_begin >= 0 && elem_count >= 0 && elem_begin + elem_count <= ti.numel(),
               path_ << ": tensor \"" << name << "\": element range [" << elem_begin << ", " << elem_begin + elem_count
                     << ") is outside its " << ti.numel() << " elements");
  const int64_t esize = static_cast<int64_t>(c10::elementSize(ti.dtype));
  auto* ptr = static_cast<uint8_t*>(mapping_->addr) + data_offset_ + ti.data_begin + elem_begin * esize;
  auto opts = at::TensorOptions().dtype(ti.dtype).device(at::kCPU);
  if (reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(esize) != 0) {
    at::Tensor out = at::empty({elem_count}, opts);
    std::memcpy(out.data_ptr(), ptr, static_cast<size_t>(elem_count * esize));
    return out;
  }
  std::shared_ptr<Mapping> keep = mapping_;
  return at::from_blob(ptr, {elem_count}, [keep](void*) mutable { keep.reset(); }, opts);
}

void SafetensorsFile::release(const std::string& name) const {
  const TensorInfo& ti = info(name);
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  auto begin = reinterpret_cast<uintptr_t>(mapping_->addr) + data_offset_ + ti.data_begin;
  auto end = reinterpret_cast<uintptr_t>(mapping_->addr) + data_offset_ + ti.data_end;
  // Only whole pages inside this tensor: a neighbour sharing a page may still be in use.
  begin = (begin + page - 1) / page * page;
  end = end / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

// ---------------------------------------------------------------------------- writer

SafetensorsWriter::SafetensorsWriter(std::string path) : path_(std::move(path)) {
  tmp_path_ = path_ + ".partial";
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ALPACA_CHECK(fd_ >= 0, tmp_path_ << ": cannot create (" << errno_text() << "); check the output directory");
  ALPACA_CHECK(::lseek(fd_, 8 + kReservedHeaderBytes, SEEK_SET) >= 0, tmp_path_ << ": seek failed");
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_) std::filesystem::remove(tmp_path_);
}

void SafetensorsWriter::add(const std::string& name, const at::Tensor& t) {
  ALPACA_CHECK(!finished_, path_ << ": add(\"" << name << "\") after finish()");
  ALPACA_CHECK(name != "__metadata__", path_ << ": \"__metadata__\" is reserved and cannot name a tensor");
  for (const auto& e : entries_) ALPACA_CHECK(e.name != name, path_ << ": tensor \"" << name << "\" added twice");
  at::Tensor c = t.detach().to(at::kCPU).contiguous();
  Entry e{name, c.scalar_type(), c.sizes().vec(), data_bytes_, data_bytes_ + static_cast<int64_t>(c.nbytes())};
  safetensors_dtype_name(e.dtype);  // fail early for an unsupported dtype
  write_all(fd_, c.data_ptr(), c.nbytes(), tmp_path_);
  data_bytes_ = e.end;
  entries_.push_back(std::move(e));
}

void SafetensorsWriter::finish(const std::map<std::string, std::string>& metadata) {
  ALPACA_CHECK(!finished_, path_ << ": finish() called twice");
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const auto& e : entries_)
    header[e.name] = {{"dtype", safetensors_dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  std::string text = header.dump();
  if (static_cast<int64_t>(text.size()) <= kReservedHeaderBytes) {
    text.append(static_cast<size_t>(kReservedHeaderBytes) - text.size(), ' ');  // JSON allows trailing spaces
    uint64_t n = static_cast<uint64_t>(kReservedHeaderBytes);
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
    pwrite_all(fd_, len, 8, 0, tmp_path_);
    pwrite_all(fd_, text.data(), text.size(), 8, tmp_path_);
    ALPACA_CHECK(::close(fd_) == 0, tmp_path_ << ": close failed (" << errno_text() << ")");
    fd_ = -1;
  } else {
    // Rare (thousands of tensors in one shard): write the exact header, then copy the data.
    ALPACA_CHECK(::close(fd_) == 0, tmp_path_ << ": close failed (" << errno_text() << ")");
    fd_ = -1;
    text.append((8 - text.size() % 8) % 8, ' ');
    const std::string big = path_ + ".partial2";
    int out = ::open(big.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ALPACA_CHECK(out >= 0, big << ": cannot create (" << errno_text() << ")");
    int in = ::open(tmp_path_.c_str(), O_RDONLY | O_CLOEXEC);
    ALPACA_CHECK(in >= 0, tmp_path_ << ": cannot reopen (" << errno_text() << ")");
    uint64_t n = text.size();
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
    write_all(out, len, 8, big);
    write_all(out, text.data(), text.size(), big);
    std::vector<char> buf(8 << 20);
    off_t pos = 8 + kReservedHeaderBytes;
    for (;;) {
      ssize_t r = ::pread(in, buf.data(), buf.size(), pos);
      ALPACA_CHECK(r >= 0, tmp_path_ << ": read failed (" << errno_text() << ")");
      if (r == 0) break;
      write_all(out, buf.data(), static_cast<size_t>(r), big);
      pos += r;
    }
    ::close(in);
    ALPACA_CHECK(::close(out) == 0, big << ": close failed (" << errno_text() << ")");
    std::filesystem::rename(big, tmp_path_);
  }
  std::filesystem::rename(tmp_path_, path_);
  finished_ = true;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  SafetensorsWriter w(path);
  for (const auto& [name, t] : tensors) w.add(name, t);
  std::map<std::string, std::string> meta = metadata;
  meta.emplace("format", "pt");
  w.finish(meta);
}

}  // namespace alpaca::io
