// DCP Hugging Face sharded safetensors: the writer of one rank's files (digest while writing) and
// the byte-range reader of a directory of them; see include/alpaca/ckpt/sharded_tensors.h.
#include "alpaca/ckpt/sharded_tensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include "alpaca/ckpt/digest.h"
#include "alpaca/util/error.h"
#include "alpaca/util/fault.h"
#include "alpaca/util/sys.h"

namespace fs = std::filesystem;

namespace alpaca::ckpt {
namespace {

int64_t product(const std::vector<int64_t>& v, size_t from = 0) {
  int64_t p = 1;
  for (size_t i = from; i < v.size(); ++i) p *= v[i];
  return p;
}

// One open file being written: every byte goes through the digest on its way to the disk, one
// block at a time (the digest reads it from memory, write() copies it while it is still in cache:
// one pass over the data, not two). Dirty page cache stays bounded: every kFlushWindow bytes the
// writer starts the kernel's writeback of that window itself (sync_file_range), waits for the
// window before it and drops those pages from the cache. So a multi-GB shard does not pile up as
// dirty pages that the kernel's flusher threads (full priority, not this thread's nice/SCHED_IDLE)
// write out in a burst beside training, and the closing fsync has little left to do.
class DigestingFile {
 public:
  static constexpr size_t kBlock = size_t{1} << 20;
  static constexpr int64_t kFlushWindow = int64_t{32} << 20;

  DigestingFile(fs::path path, bool fail) : path_(std::move(path)), fail_(fail) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ALPACA_CHECK(fd_ >= 0, "cannot create " << path_ << ": " << std::strerror(errno));
  }
  ~DigestingFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  void write(const void* data, size_t n, int64_t still_to_write) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const size_t block = std::min(n, kBlock);
      digest_.update(p, block);
      write_all(p, block, still_to_write);
      p += block;
      n -= block;
      still_to_write -= static_cast<int64_t>(block);
      if (size_ - started_ >= kFlushWindow) flush_window();
    }
  }
  WrittenFile finish(const std::string& rel) {
    ALPACA_CHECK(::fsync(fd_) == 0, "fsync of " << path_ << " failed: " << std::strerror(errno) << "; check the disk");
    if (synced_ < size_) ::posix_fadvise(fd_, synced_, size_ - synced_, POSIX_FADV_DONTNEED);
    ::close(fd_);
    fd_ = -1;
    const auto [hi, lo] = digest_.words();
    return WrittenFile{rel, size_, hi, lo};
  }

 private:
  void write_all(const char* p, size_t n, int64_t still_to_write) {
    while (n > 0) {
      ssize_t w = fail_ ? -1 : ::write(fd_, p, n);
      if (w < 0 && !fail_ && errno == EINTR) continue;
      if (w <= 0) {
        const int err = fail_ ? ENOSPC : (w < 0 ? errno : ENOSPC);  // fail_: ckpt.fail_write_rank
        ALPACA_FAIL(sys::write_failure_message(path_.string(), err, still_to_write));
      }
      p += w;
      n -= static_cast<size_t>(w);
      size_ += w;
    }
  }
  // Starts writeback of [started_, size_), then waits for the window before it and drops it from
  // the page cache. Best effort: an I/O error surfaces again at the closing fsync.
  void flush_window() {
    ::sync_file_range(fd_, started_, size_ - started_, SYNC_FILE_RANGE_WRITE);
    if (started_ > synced_) {
      ::sync_file_range(fd_, synced_, started_ - synced_,
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
      ::posix_fadvise(fd_, synced_, started_ - synced_, POSIX_FADV_DONTNEED);
      synced_ = started_;
    }
    started_ = size_;
  }

  fs::path path_;
  bool fail_;
  int fd_ = -1;
  int64_t size_ = 0;
  int64_t started_ = 0;  // writeback was started for [0, started_)
  int64_t synced_ = 0;   // [0, synced_) is on disk and out of the page cache
  Xxh3Digest digest_;
};

struct BoxedTensor {
  std::string name;
  TensorBox box;
  at::Tensor data;  // contiguous CPU
};

std::string part_header(const std::vector<BoxedTensor>& items, const std::map<std::string, std::string>& metadata,
                        int64_t* data_bytes) {
  nlohmann::json header = nlohmann::json::object(), sharding = nlohmann::json::object();
  int64_t offset = 0;
  for (const auto& it : items) {
    const int64_t n = static_cast<int64_t>(it.data.nbytes());
    header[it.name] = {{"dtype", io::safetensors_dtype_name(it.data.scalar_type())},
                       {"shape", it.box.sizes},
                       {"data_offsets", {offset, offset + n}}};
    sharding[it.name] = {{"saved_offsets", it.box.offsets}};
    offset += n;
  }
  nlohmann::json meta = {{"format", "pt"}, {"DCP_SHARDING_INFO", sharding.dump()}, {"DCP_VERSION", "1.0"}};
  for (const auto& [k, v] : metadata) meta[k] = v;
  header["__metadata__"] = meta;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // safetensors pads the header to 8 bytes
  *data_bytes = offset;
  return text;
}

WrittenFile write_part(const fs::path& dir, const std::string& rel, const std::vector<BoxedTensor>& items,
                       const std::map<std::string, std::string>& metadata, bool fail) {
  int64_t data_bytes = 0;
  const std::string header = part_header(items, metadata, &data_bytes);
  DigestingFile f(dir / rel, fail);
  uint64_t len = header.size();
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(len >> (8 * i));
  int64_t left = 8 + static_cast<int64_t>(len) + data_bytes;
  f.write(le, 8, left);
  f.write(header.data(), header.size(), left - 8);
  left -= 8 + static_cast<int64_t>(len);
  for (const auto& it : items) {
    f.write(it.data.data_ptr(), it.data.nbytes(), left);
    left -= static_cast<int64_t>(it.data.nbytes());
  }
  return f.finish(rel);
}

}  // namespace

int64_t TensorBox::numel() const { return product(sizes); }

std::vector<TensorBox> range_boxes(const std::vector<int64_t>& shape, int64_t begin, int64_t end) {
  const int64_t numel = product(shape);
  ALPACA_CHECK(0 <= begin && begin <= end && end <= numel,
               "range_boxes: [" << begin << ", " << end << ") is not inside a tensor of " << numel << " elements");
  std::vector<TensorBox> out;
  if (begin == end) return out;
  if (shape.size() <= 1) {
    TensorBox b;
    if (shape.size() == 1) b.offsets = {begin}, b.sizes = {end - begin};
    out.push_back(b);
    return out;
  }
  const int64_t row = product(shape, 1);
  auto rows_box = [&](int64_t r0, int64_t r1, int64_t range_offset) {
    TensorBox b;
    b.offsets.assign(shape.size(), 0);
    b.offsets[0] = r0;
    b.sizes = shape;
    b.sizes[0] = r1 - r0;
    b.range_offset = range_offset;
    return b;
  };
  if (shape.size() > 2) {
    ALPACA_CHECK(begin % row == 0 && end % row == 0, "range_boxes: a shard of a " << shape.size()
                 << "-D tensor must start and end on whole rows of " << row << " elements, got [" << begin << ", " << end << ")");
    out.push_back(rows_box(begin / row, end / row, 0));
    return out;
  }
  int64_t cur = begin;
  if (cur % row != 0) {  // the partial row it starts in
    const int64_t stop = std::min(end, (cur / row + 1) * row);
    out.push_back(TensorBox{{cur / row, cur % row}, {1, stop - cur}, 0, 1});
    cur = stop;
  }
  if (end / row > cur / row && cur < end) {  // whole rows
    out.push_back(rows_box(cur / row, end / row, cur - begin));
    cur = (end / row) * row;
  }
  if (cur < end) out.push_back(TensorBox{{cur / row, 0}, {1, end - cur}, cur - begin, 2});  // the row it ends in
  return out;
}

std::string shard_file_name(const std::string& sub, const std::string& stem, int rank, int part) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "shard-%05d-%s-%05d-of-%05d.safetensors", rank + 1, stem.c_str(), part + 1, kShardParts);
  return sub.empty() ? std::string(buf) : sub + "/" + buf;
}

std::vector<WrittenFile> write_rank_shards(const fs::path& checkpoint_dir, const std::string& sub, const std::string& stem,
                                           int rank, const std::vector<RangePiece>& pieces,
                                           const std::map<std::string, std::string>& metadata) {
  std::vector<std::vector<BoxedTensor>> parts(kShardParts);
  for (const auto& p : pieces) {
    ALPACA_CHECK(p.values.dim() == 1 && p.values.numel() == p.end - p.begin && p.values.device().is_cpu(),
                 "write_rank_shards: the values of " << p.name << " must be a 1-D CPU tensor of " << p.end - p.begin << " elements");
    for (const TensorBox& b : range_boxes(p.shape, p.begin, p.end))
      parts[b.part].push_back({p.name, b, p.values.narrow(0, b.range_offset, b.numel()).contiguous()});
  }
  fs::create_directories(checkpoint_dir / sub);
  // Fault injection: that rank's writes fail as on a full disk (the one-rank disk-full test).
  const auto fail_rank = util::fault_int("ckpt.fail_write_rank", -1);
  const bool fail = fail_rank && *fail_rank == rank;
  std::vector<WrittenFile> out(kShardParts);
  for (int part = 0; part < kShardParts; ++part) {
    out[part].relative_path = shard_file_name(sub, stem, rank, part);
    if (parts[part].empty()) continue;  // torch's consolidator refuses files without sharding info
    out[part] = write_part(checkpoint_dir, out[part].relative_path, parts[part], metadata, fail);
  }
  return out;
}

ShardedTensorReader ShardedTensorReader::open(const fs::path& dir) {
  ALPACA_CHECK(fs::is_directory(dir), "sharded checkpoint directory " << dir << " does not exist");
  std::vector<fs::path> paths;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".safetensors") paths.push_back(e.path());
  std::sort(paths.begin(), paths.end());
  ALPACA_CHECK(!paths.empty(), dir << " holds no .safetensors files; the checkpoint is incomplete, resume from an older one");
  ShardedTensorReader r;
  r.dir_ = dir;
  for (const auto& p : paths) {
    auto file = io::SafetensorsFile::open(p.string());
    r.files_.push_back(file);
    nlohmann::json sharding = nlohmann::json::object();
    auto it = file->metadata().find("DCP_SHARDING_INFO");
    if (it != file->metadata().end()) {
      try {
        sharding = nlohmann::json::parse(it->second);
      } catch (const std::exception& e) {
        ALPACA_FAIL(p.string() << " has a DCP_SHARDING_INFO that is not JSON (" << e.what() << "); the file is corrupt");
      }
    }
    for (const std::string& name : file->names()) {
      const io::TensorInfo& info = file->info(name);
      std::vector<int64_t> offsets(info.shape.size(), 0);
      if (sharding.contains(name)) offsets = sharding[name].at("saved_offsets").get<std::vector<int64_t>>();
      ALPACA_CHECK(offsets.size() == info.shape.size(), p.string() << ": saved_offsets of " << name << " has "
                   << offsets.size() << " dimensions, the tensor " << info.shape.size());
      Entry& e = r.tensors_[name];
      if (e.chunks.empty()) e.shape.assign(offsets.size(), 0), e.dtype = info.dtype;
      for (size_t d = 0; d < offsets.size(); ++d) e.shape[d] = std::max(e.shape[d], offsets[d] + info.shape[d]);
      e.chunks.push_back({file, offsets, info.shape});
    }
  }
  return r;
}

std::vector<std::string> ShardedTensorReader::names() const {
  std::vector<std::string> out;
  for (const auto& [n, e] : tensors_) out.push_back(n);
  return out;
}

const std::vector<int64_t>& ShardedTensorReader::shape(const std::string& name) const {
  auto it = tensors_.find(name);
  ALPACA_CHECK(it != tensors_.end(), dir_.string() << " has no tensor " << name << "; the checkpoint does not match the model");
  return it->second.shape;
}

at::ScalarType ShardedTensorReader::dtype(const std::string& name) const {
  shape(name);
  return tensors_.at(name).dtype;
}

std::string ShardedTensorReader::metadata(const std::string& key) const {
  for (const auto& f : files_) {
    auto it = f->metadata().find(key);
    if (it != f->metadata().end()) return it->second;
  }
  return "";
}

void ShardedTensorReader::read_range(const std::string& name, int64_t begin, int64_t end, at::Tensor out) const {
  const std::vector<int64_t>& shp = shape(name);
  const Entry& e = tensors_.at(name);
  std::vector<int64_t> stride(shp.size(), 1);
  for (int d = static_cast<int>(shp.size()) - 2; d >= 0; --d) stride[d] = stride[d + 1] * shp[d + 1];
  int64_t covered = 0;
  auto copy = [&](const Chunk& c, int64_t flat0, int64_t in_chunk0, int64_t n) {  // a contiguous run
    const int64_t lo = std::max(begin, flat0), hi = std::min(end, flat0 + n);
    if (lo >= hi) return;
    out.narrow(0, lo - begin, hi - lo).copy_(c.file->tensor_range(name, in_chunk0 + (lo - flat0), hi - lo));
    covered += hi - lo;
  };
  for (const Chunk& c : e.chunks) {
    int64_t flat0 = 0;
    for (size_t d = 0; d < shp.size(); ++d) flat0 += c.offsets[d] * stride[d];
    // Contiguous in flat order: the dimensions after the first partial one are whole, those
    // before it have size 1 (our writer's boxes always are).
    int k = static_cast<int>(shp.size()) - 1;
    while (k >= 0 && c.sizes[k] == shp[k]) --k;
    bool contiguous = true;
    for (int d = 0; d < k; ++d) contiguous = contiguous && c.sizes[d] == 1;
    if (contiguous) {
      copy(c, flat0, 0, product(c.sizes));
      continue;
    }
    ALPACA_CHECK(shp.size() == 2, c.file->path() << ": the box of " << name << " is not contiguous and the tensor is "
                                                << shp.size() << "-D; only 2-D boxes are read row by row");
    const int64_t first = std::max<int64_t>(0, begin / shp[1] - c.offsets[0]);
    for (int64_t r = first; r < c.sizes[0] && (c.offsets[0] + r) * shp[1] < end; ++r)
      copy(c, (c.offsets[0] + r) * shp[1] + c.offsets[1], r * c.sizes[1], c.sizes[1]);
  }
  ALPACA_CHECK(covered == end - begin, dir_.string() << ": elements [" << begin << ", " << end << ") of " << name
               << " are " << (covered < end - begin ? "not all" : "more than once") << " in its shard files (" << covered
               << " of " << end - begin << " found); a shard file is missing or the checkpoint is corrupt");
}

at::Tensor ShardedTensorReader::read(const std::string& name) const {
  at::Tensor t = at::empty(shape(name), at::TensorOptions().dtype(dtype(name)));
  read_range(name, 0, t.numel(), t.view({-1}));
  return t;
}

}  // namespace alpaca::ckpt
