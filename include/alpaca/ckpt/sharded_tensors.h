// Sharded checkpoint tensors in the layout of PyTorch distributed checkpoint's Hugging Face
// storage (torch/distributed/checkpoint/hf_storage.py, _hf_utils.py): every rank writes its own
// safetensors files, named shard-<rank+1>-<stem>-<part>-of-00003.safetensors, whose tensors carry
// HF parameter names and whose "__metadata__" holds "DCP_SHARDING_INFO", a JSON string
// {name: {"saved_offsets": [...]}} giving where the stored box sits in the global tensor (the
// global shape is the maximum of offset + size over all files, as torch's reader computes it).
//
// An FSDP rank owns a contiguous range of a parameter's flattened elements, which is not always a
// box: it is cut into at most three (whole rows, the partial row it starts in, the partial row it
// ends in), and each goes to its own file (part 1, 2, 3), since a safetensors file holds a name
// once. torch's HuggingFaceStorageReader and _consolidate_hf_safetensors read such a directory.
#pragma once

#include <ATen/ATen.h>  // defines: at::Tensor

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "alpaca/io/safetensors.h"

namespace alpaca::ckpt {

inline constexpr int kShardParts = 3;

// A box of a tensor: per-dimension offsets and sizes; `range_offset` is where its elements start
// inside the range it was cut from; `part` (0..2) the file it goes to.
struct TensorBox {
  std::vector<int64_t> offsets, sizes;
  int64_t range_offset = 0;
  int part = 0;
  int64_t numel() const;
};

// Elements [begin, end) of a flattened tensor of `shape` as at most three boxes, in flat order.
// 0-D and 1-D tensors give one box; tensors of 3 or more dimensions are cut along their first
// dimension only and must then start and end on its boundaries (LLaMA has none). Throws otherwise.
std::vector<TensorBox> range_boxes(const std::vector<int64_t>& shape, int64_t begin, int64_t end);

// One rank's piece of a tensor: elements [begin, end) of the flattened global tensor `name`.
struct RangePiece {
  std::string name;
  std::vector<int64_t> shape;  // global shape
  int64_t begin = 0, end = 0;
  at::Tensor values;           // 1-D, end - begin elements, CPU, the dtype to store
};

// A file written by write_rank_shards: its path relative to the checkpoint directory, size and
// XXH3-128 digest (computed while writing). size < 0: no file for this part (nothing in it).
struct WrittenFile {
  std::string relative_path;
  int64_t size = -1;
  uint64_t digest_high = 0, digest_low = 0;
};

// "<sub>/shard-<rank+1, 5 digits>-<stem>-<part+1, 5 digits>-of-00003.safetensors".
std::string shard_file_name(const std::string& sub, const std::string& stem, int rank, int part);

// Writes this rank's `pieces` under checkpoint_dir/sub (created if needed): one file per part that
// has a box, each fsync'ed, its digest computed from the bytes as they are written. Returns
// kShardParts entries (size -1 where no file was written). `metadata` joins "format",
// "DCP_SHARDING_INFO" and "DCP_VERSION". Throws naming the file on a write error (a full disk).
std::vector<WrittenFile> write_rank_shards(const std::filesystem::path& checkpoint_dir, const std::string& sub,
                                           const std::string& stem, int rank, const std::vector<RangePiece>& pieces,
                                           const std::map<std::string, std::string>& metadata = {});

// Reads a directory of such files (any number of ranks, any cut) by byte ranges: each file is
// memory-mapped and only the pages of the requested elements are touched.
class ShardedTensorReader {
 public:
  // Every *.safetensors in `dir`; files without DCP_SHARDING_INFO hold whole tensors.
  static ShardedTensorReader open(const std::filesystem::path& dir);
  const std::filesystem::path& dir() const { return dir_; }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const std::vector<int64_t>& shape(const std::string& name) const;
  at::ScalarType dtype(const std::string& name) const;
  // The metadata value `key` of the first file that has it ("" when none).
  std::string metadata(const std::string& key) const;
  // Elements [begin, end) of the flattened tensor into `out` (1-D, end - begin elements, any dtype:
  // converted). Throws naming the tensor and directory when some of them are in no file.
  void read_range(const std::string& name, int64_t begin, int64_t end, at::Tensor out) const;
  at::Tensor read(const std::string& name) const;  // the whole tensor, in its stored dtype

 private:
  struct Chunk {
    std::shared_ptr<io::SafetensorsFile> file;
    std::vector<int64_t> offsets, sizes;
  };
  struct Entry {
    std::vector<int64_t> shape;
    at::ScalarType dtype = at::kFloat;
    std::vector<Chunk> chunks;
  };
  std::filesystem::path dir_;
  std::map<std::string, Entry> tensors_;
  std::vector<std::shared_ptr<io::SafetensorsFile>> files_;
};

}  // namespace alpaca::ckpt
