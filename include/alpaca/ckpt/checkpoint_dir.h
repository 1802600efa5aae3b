// Checkpoint directories in an output_dir, with Hugging Face Trainer's naming and rotation
// (`checkpoint-<step>/`, transformers.trainer_utils.sort_checkpoints / rotate_checkpoints), made
// crash-safe: a checkpoint is written under `tmp-checkpoint-<step>/`, every file is fsync'ed, a
// completion marker listing every file and its size is written last, then the directory is
// renamed into place and the parent directory fsync'ed. A `checkpoint-<step>/` without a valid
// marker (a copy interrupted half-way, a file truncated afterwards) is never resumed from.
//
// Pure filesystem code: no communicator. The trainer decides which rank calls what (rank 0
// creates and finalizes; every rank may write files into the staging directory in between,
// separated by barriers).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace alpaca::ckpt {

inline constexpr const char* kCheckpointPrefix = "checkpoint";
inline constexpr const char* kStagingPrefix = "tmp-checkpoint";
// Written last into a checkpoint; JSON {"step": n, "files": {"relative/path": size_bytes, ...},
// "xxh3_128": {"relative/path": hex, ...}} (ckpt/digest.h). Checkpoints of earlier versions carry
// "sha256" digests instead, or none at all; both still verify and resume.
inline constexpr const char* kCompleteMarker = "checkpoint_complete.json";

std::string checkpoint_name(int64_t step);  // "checkpoint-<step>"
// The step of a directory name "checkpoint-<digits>"; nullopt for anything else.
std::optional<int64_t> parse_checkpoint_step(const std::string& dir_name);

// Writes `bytes` to `path` and fsyncs it (the file is complete on disk when this returns).
void write_file_durable(const std::filesystem::path& path, const std::string& bytes);
// fsyncs an existing file or directory. Throws alpaca::Error naming the path on failure.
void fsync_path(const std::filesystem::path& path);

// One checkpoint being written. begin() (rank 0) creates a clean staging directory;
// every rank writes its files under staging_dir(); commit() (rank 0, after a barrier) fsyncs
// them, writes the marker and renames the staging directory to checkpoint-<step>, replacing an
// existing checkpoint of the same step. Nothing named checkpoint-<step> exists until commit().
class CheckpointWriter {
 public:
  CheckpointWriter(std::filesystem::path output_dir, int64_t step);
  void begin();  // rank 0 only
  const std::filesystem::path& staging_dir() const { return staging_; }
  std::filesystem::path final_dir() const;
  // Returns the final directory. Throws alpaca::Error when the staging directory is missing.
  // `known`: files other ranks wrote and fsync'ed, with the size and digest they computed while
  // writing (relative path -> (size, xxh3 hex)); they are not read again. The other files (the
  // small ones rank 0 wrote) are fsync'ed and digested here.
  std::filesystem::path commit(const std::map<std::string, std::pair<int64_t, std::string>>& known = {});  // rank 0 only
  // After a failed save (rank 0): removes the staging directory, so nothing half-written stays
  // behind, and returns a sentence for the error: how many bytes the save had written and the
  // newest checkpoint-<step> that is still there with its size (about what a checkpoint needs).
  std::string abandon();

 private:
  std::filesystem::path output_dir_;
  int64_t step_;
  std::filesystem::path staging_;
};

// Why a checkpoint directory cannot be resumed from, naming the file; empty when it is complete:
// the marker exists, parses, names this step, and every listed file exists with the listed size
// and (when the marker has them) the listed digest. Reads every byte of the checkpoint, unless
// `world` > 1: then only the files whose index in the marker is `rank` modulo `world` are read
// (every rank verifies its share, and the caller combines the answers).
std::string checkpoint_problem(const std::filesystem::path& checkpoint_dir, int rank = 0, int world = 1);

// The newest complete checkpoint-<step> in output_dir (by step), skipping incomplete or corrupt
// ones with a warning that names them and says why; nullopt when there is none.
std::optional<std::filesystem::path> find_latest_complete_checkpoint(const std::filesystem::path& output_dir);

// Removes `tmp-checkpoint-*` left behind by a run that died while saving (rank 0, at start).
// Returns the removed directories.
std::vector<std::filesystem::path> remove_stale_staging(const std::filesystem::path& output_dir);

// transformers.trainer_utils.sort_checkpoints: checkpoint-* directories oldest first, by step
// (or by mtime, falling back to steps when the mtimes span less than a second); the best model
// checkpoint is moved to second-to-last so rotation never deletes it while the newest stays last.
std::vector<std::filesystem::path> sort_checkpoints(const std::filesystem::path& output_dir, bool use_mtime = false,
                                                    const std::string& best_model_checkpoint = "");

// transformers.trainer_utils.rotate_checkpoints: keeps at most save_total_limit checkpoints
// (no-op when limit <= 0), never the newest nor the best model checkpoint. Returns the deleted ones.
std::vector<std::filesystem::path> rotate_checkpoints(const std::filesystem::path& output_dir, int64_t save_total_limit,
                                                      const std::string& best_model_checkpoint = "",
                                                      bool use_mtime = true);

}  // namespace alpaca::ckpt
