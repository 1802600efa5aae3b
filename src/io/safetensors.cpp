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
#include "alpaca/util/sys.h"

namespace alpaca::io {
namespace {

using nlohmann::json;

// Header space reserved by the writer so data can stream to disk before the header is known.
constexpr int64_t kReservedHeaderBytes = 64 << 10;

std::string errno_text() { return std::strerror(errno); }

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    ALPACA_CHECK(w > 0, sys::write_failure_message(path, w < 0 ? errno : ENOSPC, static_cast<int64_t>(n)));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void pwrite_all(int fd, const void* data, size_t n, off_t off, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, n, off);
    if (w < 0 && errno == EINTR) continue;
    ALPACA_CHECK(w > 0, sys::write_failure_message(path, w < 0 ? errno : ENOSPC, static_cast<int64_t>(n)));
    p += w;
    off += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

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

  SafetensorsHeader h = parse_safetensors_header(base, file_size, path);
  f->data_offset_ = h.data_offset;
  f->tensors_ = std::move(h.tensors);
  f->metadata_ = std::move(h.metadata);
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->index_[f->tensors_[i].name] = i;
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
    if (elem_count > 0) std::memcpy(out.data_ptr(), ptr, static_cast<size_t>(elem_count * esize));  // empty: no buffer
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
