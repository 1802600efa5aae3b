#include "alpaca/ckpt/checkpoint_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>  // defines: nlohmann::json
#include <regex>
#include <set>
#include <sstream>

#include "alpaca/ckpt/digest.h"
#include "alpaca/ckpt/resume_state.h"  // defines: sha256_file
#include "alpaca/util/error.h"
#include "alpaca/util/log.h"
#include "alpaca/util/sys.h"

namespace fs = std::filesystem;

namespace alpaca::ckpt {
namespace {

std::string read_text(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  ALPACA_CHECK(f, "cannot open " << path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Every regular file under dir (relative paths, sorted), except the marker itself.
std::vector<fs::path> files_under(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    fs::path rel = fs::relative(e.path(), dir);
    if (rel == kCompleteMarker) continue;
    out.push_back(rel);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::string checkpoint_name(int64_t step) { return std::string(kCheckpointPrefix) + "-" + std::to_string(step); }

std::optional<int64_t> parse_checkpoint_step(const std::string& dir_name) {
  static const std::regex re(std::string("^") + kCheckpointPrefix + "-([0-9]+)$");
  std::smatch m;
  if (!std::regex_match(dir_name, m, re)) return std::nullopt;
  try {
    return std::stoll(m[1].str());
  } catch (const std::out_of_range&) {
    return std::nullopt;
  }
}

void fsync_path(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ALPACA_CHECK(fd >= 0, "cannot open " << path << " to flush it to disk: " << std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some filesystems refuse fsync on directories (EINVAL); the data files were flushed already.
  ALPACA_CHECK(rc == 0 || (err == EINVAL && fs::is_directory(path)),
               "fsync of " << path << " failed: " << std::strerror(err) << "; check the disk and free space");
}

void write_file_durable(const fs::path& path, const std::string& bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ALPACA_CHECK(fd >= 0, "cannot create " << path << ": " << std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : ENOSPC;
      ::close(fd);
      ALPACA_FAIL(sys::write_failure_message(path.string(), err, static_cast<int64_t>(bytes.size() - done)));
    }
    done += static_cast<size_t>(n);
  }
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  ALPACA_CHECK(rc == 0, "fsync of " << path << " failed: " << std::strerror(err));
}

CheckpointWriter::CheckpointWriter(fs::path output_dir, int64_t step)
    : output_dir_(std::move(output_dir)),
      step_(step),
      staging_(output_dir_ / (std::string(kStagingPrefix) + "-" + std::to_string(step))) {}

fs::path CheckpointWriter::final_dir() const { return output_dir_ / checkpoint_name(step_); }

void CheckpointWriter::begin() {
  fs::create_directories(output_dir_);
  std::error_code ec;
  fs::remove_all(staging_, ec);
  ALPACA_CHECK(!ec, "cannot clear the staging directory " << staging_ << ": " << ec.message());
  fs::create_directories(staging_);
}

fs::path CheckpointWriter::commit(const std::map<std::string, std::pair<int64_t, std::string>>& known) {
  ALPACA_CHECK(fs::is_directory(staging_), "checkpoint staging directory " << staging_
                                               << " vanished before it was committed; was output_dir shared by two runs?");
  nlohmann::json files = nlohmann::json::object(), digests = nlohmann::json::object();
  for (const fs::path& rel : files_under(staging_)) {
    const std::string key = rel.generic_string();
    auto it = known.find(key);
    if (it != known.end()) {  // a shard file: its rank flushed it and digested it while writing
      const auto actual = static_cast<int64_t>(fs::file_size(staging_ / rel));
      ALPACA_CHECK(actual == it->second.first, "checkpoint file " << (staging_ / rel).string() << " has " << actual
                   << " bytes, its rank wrote " << it->second.first << "; was output_dir shared by two runs?");
      files[key] = actual;
      digests[key] = it->second.second;
      continue;
    }
    fsync_path(staging_ / rel);
    files[key] = static_cast<int64_t>(fs::file_size(staging_ / rel));
    // A small file rank 0 wrote: read back from the page cache, so a resume verifies every byte.
    digests[key] = xxh3_file((staging_ / rel).string());
  }
  for (const auto& [key, v] : known)
    ALPACA_CHECK(files.contains(key), "checkpoint file " << (staging_ / key).string()
                 << " was written by its rank but is not in the staging directory; was output_dir shared by two runs?");
  for (const auto& e : fs::recursive_directory_iterator(staging_)) {
    if (e.is_directory()) fsync_path(e.path());
  }
  nlohmann::json marker = {{"step", step_}, {"files", files}, {kDigestAlgorithm, digests}};
  write_file_durable(staging_ / kCompleteMarker, marker.dump(2) + "\n");
  fsync_path(staging_);
  const fs::path dst = final_dir();
  if (fs::exists(dst)) {
    // Saving the same step twice (e.g. the final step coincides with save_steps): the new one wins.
    fs::path old = output_dir_ / (std::string(kStagingPrefix) + "-" + std::to_string(step_) + "-replaced");
    fs::remove_all(old);
    fs::rename(dst, old);
    fs::rename(staging_, dst);
    fs::remove_all(old);
  } else {
    fs::rename(staging_, dst);
  }
  fsync_path(output_dir_);
  return dst;
}

namespace {
int64_t directory_bytes(const fs::path& dir) {
  int64_t total = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec)) total += static_cast<int64_t>(it->file_size(ec));
  }
  return total;
}
}  // namespace

std::string CheckpointWriter::abandon() {
  std::ostringstream os;
  const int64_t written = fs::exists(staging_) ? directory_bytes(staging_) : 0;
  std::error_code ec;
  fs::remove_all(staging_, ec);
  os << checkpoint_name(step_) << " was not saved (" << written << " bytes written before the failure";
  os << (ec ? "; could not remove " + staging_.string() + ": " + ec.message() : "; the partial " + staging_.string() + " was removed")
     << ")";
  const auto previous = sort_checkpoints(output_dir_);
  if (!previous.empty())
    os << "; the previous checkpoint " << previous.back().string() << " is untouched and a checkpoint of this run needs about "
       << directory_bytes(previous.back()) << " bytes";
  return os.str();
}

std::string checkpoint_problem(const fs::path& dir, int rank, int world) {
  if (!fs::is_directory(dir)) return "it is not a directory";
  const fs::path marker_path = dir / kCompleteMarker;
  if (!fs::exists(marker_path)) {
    // A transformers Trainer checkpoint (someone moving a run over): say what it is, not "unfinished".
    for (const char* hf_file : {"optimizer.pt", "scheduler.pt", "training_args.bin"})
      if (fs::exists(dir / hf_file))
        return std::string("it is a Hugging Face Trainer checkpoint (") + hf_file +
               "), whose optimizer and scheduler states are torch pickles alpaca-train does not resume; start a "
               "run from its weights with --model_name_or_path " + dir.string();
    return std::string("it has no ") + kCompleteMarker + " (the save did not finish)";
  }
  nlohmann::json marker;
  try {
    marker = nlohmann::json::parse(read_text(marker_path));
  } catch (const std::exception& e) {
    return std::string(kCompleteMarker) + " is not valid JSON (" + e.what() + ")";
  }
  if (!marker.is_object() || !marker.contains("files") || !marker["files"].is_object() || !marker.contains("step"))
    return std::string(kCompleteMarker) + " lacks 'step' or 'files'";
  if (!marker["step"].is_number_integer()) return std::string(kCompleteMarker) + " has a 'step' that is not an integer";
  auto step = parse_checkpoint_step(dir.filename().string());
  if (step && marker["step"].get<int64_t>() != *step)
    return "its marker says step " + std::to_string(marker["step"].get<int64_t>()) + " but the directory is named " +
           dir.filename().string();
  for (const auto& [rel, size] : marker["files"].items()) {
    const fs::path p = dir / rel;
    if (!size.is_number_integer()) return std::string(kCompleteMarker) + " lists file " + rel + " without an integer size";
    if (!fs::exists(p)) return "file " + (dir / rel).string() + " is missing";
    const auto actual = static_cast<int64_t>(fs::file_size(p));
    if (actual != size.get<int64_t>())
      return "file " + (dir / rel).string() + " has " + std::to_string(actual) + " bytes, " +
             std::to_string(size.get<int64_t>()) + " were written (truncated or replaced)";
  }
  // XXH3 since the sharded checkpoints; SHA-256 before; sizes only before the checksums. All resume.
  const char* algo = marker.contains(kDigestAlgorithm) ? kDigestAlgorithm : marker.contains("sha256") ? "sha256" : nullptr;
  if (!algo) return "";
  if (!marker[algo].is_object()) return std::string(kCompleteMarker) + " has a '" + algo + "' that is not an object";
  int index = 0;
  for (const auto& [rel, size] : marker["files"].items()) {
    if (!marker[algo].contains(rel) || !marker[algo][rel].is_string())
      return std::string(kCompleteMarker) + " has no " + algo + " digest for file " + rel;
    if (world > 1 && index++ % world != rank) continue;  // another rank verifies it
    const std::string want = marker[algo][rel].get<std::string>();
    const std::string path = (dir / rel).string();
    const std::string got = std::string(algo) == "sha256" ? sha256_file(path) : xxh3_file(path);
    if (got != want)
      return "file " + path + " is corrupt: its " + algo + " is " + got + ", " + want +
             " was written (a flipped or overwritten byte)";
  }
  return "";
}

std::optional<fs::path> find_latest_complete_checkpoint(const fs::path& output_dir) {
  if (!fs::is_directory(output_dir)) return std::nullopt;
  std::vector<std::pair<int64_t, fs::path>> found;
  for (const auto& e : fs::directory_iterator(output_dir)) {
    if (!e.is_directory()) continue;
    if (auto step = parse_checkpoint_step(e.path().filename().string())) found.emplace_back(*step, e.path());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [step, path] : found) {
    const std::string why = checkpoint_problem(path);
    if (why.empty()) return path;
    ALPACA_WARN("skipping checkpoint " << path.string() << ": " << why);
  }
  return std::nullopt;
}

std::vector<fs::path> remove_stale_staging(const fs::path& output_dir) {
  std::vector<fs::path> removed;
  if (!fs::is_directory(output_dir)) return removed;
  const std::string prefix = std::string(kStagingPrefix) + "-";
  for (const auto& e : fs::directory_iterator(output_dir)) {
    if (e.is_directory() && e.path().filename().string().rfind(prefix, 0) == 0) removed.push_back(e.path());
  }
  for (const auto& p : removed) {
    ALPACA_WARN("removing " << p.string() << ", a checkpoint that an earlier run did not finish writing");
    fs::remove_all(p);
  }
  return removed;
}

std::vector<fs::path> sort_checkpoints(const fs::path& output_dir, bool use_mtime,
                                       const std::string& best_model_checkpoint) {
  std::vector<std::pair<double, fs::path>> ordering;
  if (fs::is_directory(output_dir)) {
    // HF globs "checkpoint-*" and takes the digits after the last "checkpoint-" (regex ".*checkpoint-([0-9]+)").
    static const std::regex re(std::string(".*") + kCheckpointPrefix + "-([0-9]+).*");
    const std::string prefix = std::string(kCheckpointPrefix) + "-";
    for (const auto& e : fs::directory_iterator(output_dir)) {
      const std::string name = e.path().filename().string();
      if (!e.is_directory() || name.rfind(prefix, 0) != 0) continue;
      if (use_mtime) {
        const auto t = fs::last_write_time(e.path()).time_since_epoch();
        ordering.emplace_back(std::chrono::duration<double>(t).count(), e.path());
      } else {
        std::smatch m;
        const std::string full = e.path().string();
        if (std::regex_match(full, m, re)) ordering.emplace_back(std::stod(m[1].str()), e.path());
      }
    }
  }
  std::sort(ordering.begin(), ordering.end());
  if (use_mtime && ordering.size() > 1 && ordering.back().first - ordering.front().first < 1.0) {
    // As HF: mtimes closer than a second are not trusted; order by step instead.
    return sort_checkpoints(output_dir, false, best_model_checkpoint);
  }
  std::vector<fs::path> sorted;
  for (auto& [key, path] : ordering) sorted.push_back(path);
  if (!best_model_checkpoint.empty()) {
    const fs::path best = fs::path(best_model_checkpoint).lexically_normal();
    auto it = std::find_if(sorted.begin(), sorted.end(), [&](const fs::path& p) { return p.lexically_normal() == best; });
    if (it != sorted.end() && sorted.back().lexically_normal() != best) {
      const fs::path best_path = *it;
      const fs::path newest = sorted.back();
      std::vector<fs::path> rest;
      for (const auto& p : sorted)
        if (p != best_path && p != newest) rest.push_back(p);
      rest.push_back(best_path);
      rest.push_back(newest);
      sorted = std::move(rest);
    }
  }
  return sorted;
}

std::vector<fs::path> rotate_checkpoints(const fs::path& output_dir, int64_t save_total_limit,
                                         const std::string& best_model_checkpoint, bool use_mtime) {
  std::vector<fs::path> deleted;
  if (save_total_limit <= 0) return deleted;
  const auto checkpoints = sort_checkpoints(output_dir, use_mtime);
  if (static_cast<int64_t>(checkpoints.size()) <= save_total_limit) return deleted;
  std::set<fs::path> keep = {checkpoints.back().lexically_normal()};
  if (!best_model_checkpoint.empty()) keep.insert(fs::path(best_model_checkpoint).lexically_normal());
  const int64_t num_to_keep = std::max<int64_t>(save_total_limit, static_cast<int64_t>(keep.size()));
  int64_t remaining = static_cast<int64_t>(checkpoints.size());
  for (const auto& c : checkpoints) {
    if (remaining <= num_to_keep) break;
    if (keep.count(c.lexically_normal())) continue;
    ALPACA_INFO("deleting older checkpoint " << c.string() << " (save_total_limit " << save_total_limit << ")");
    std::error_code ec;
    fs::remove_all(c, ec);
    deleted.push_back(c);
    --remaining;
  }
  return deleted;
}

}  // namespace alpaca::ckpt
