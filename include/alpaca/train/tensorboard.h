// TensorBoard event files, as Hugging Face Trainer's TensorBoardCallback writes them through
// torch.utils.tensorboard.SummaryWriter: one file events.out.tfevents.<time>.<host>.<pid>.<n> per
// writer, a file_version event first, then one Event per scalar (Summary.Value with
// simple_value; the first value of each tag carries the "scalars" plugin metadata) and text as
// the text plugin's string tensor under "<tag>/text_summary". Records use TFRecord framing
// (length, masked CRC32C of the length, payload, masked CRC32C of the payload). Each call writes
// whole records and flushes them to the OS, so a running job shows up live and a killed one
// leaves a file whose every record is complete.
//
// The protobuf and Boost.CRC code lives behind this header (src/train/tensorboard_proto.cpp, in
// its own library built without LibTorch on the include path); no third-party type appears here.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace alpaca::train {

// CRC32C (Castagnoli) of `data`, masked as TFRecord does: ((c >> 15) | (c << 17)) + 0xa282ead8.
uint32_t masked_crc32c(std::string_view data);
// One TFRecord: uint64 length (little-endian), masked CRC of those 8 bytes, payload, masked CRC of
// the payload.
std::string tfrecord(std::string_view payload);

// HF's rewrite_logs: "eval_<k>" -> "eval/<k>", "test_<k>" -> "test/<k>", anything else ->
// "train/<k>".
std::string tensorboard_tag(const std::string& key);

// HF's default logging directory name below output_dir: runs/<Mon><DD>_<HH>-<MM>-<SS>_<host>
// (transformers' default_logdir, local time).
std::filesystem::path default_tensorboard_subdir();

class TensorBoardWriter {
 public:
  TensorBoardWriter();  // disabled: every call does nothing
  // Creates `log_dir` (naming `flag` in the error when it cannot) and a new event file in it
  // holding the file_version event.
  TensorBoardWriter(const std::filesystem::path& log_dir, const std::string& flag = "--logging_dir");
  ~TensorBoardWriter();
  TensorBoardWriter(TensorBoardWriter&&) noexcept;
  TensorBoardWriter& operator=(TensorBoardWriter&&) noexcept;

  bool enabled() const { return impl_ != nullptr; }
  const std::filesystem::path& path() const;  // the event file ("" when disabled)

  // One scalar event per (tag, value) at `step`, all written and flushed together.
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  // torch's SummaryWriter.add_text: tag "<tag>/text_summary", a DT_STRING tensor of shape [1].
  void add_text(const std::string& tag, const std::string& text, int64_t step);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace alpaca::train
