// TensorBoard event files: the messages of tensorboard_event.proto (TensorBoard's field numbers),
// serialized by libprotobuf, framed as TFRecords with Boost.CRC's CRC32C. Built in its own
// library without LibTorch on the include path (the torch wheel ships protobuf headers of its own).
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <boost/crc.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <set>

#include "alpaca/train/tensorboard.h"
#include "alpaca/util/error.h"
#include "tensorboard_event.pb.h"

namespace alpaca::train {
namespace {

namespace fs = std::filesystem;

// CRC-32C: polynomial 0x1EDC6F41, initial and final XOR 0xFFFFFFFF, reflected in and out.
using Crc32c = boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true>;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

std::string serialize(const tb::Event& e) {
  std::string bytes;
  ALPACA_CHECK(e.SerializeToString(&bytes), "cannot serialize a TensorBoard event");
  return bytes;
}

// torch.utils.tensorboard's file names number the writers of a process from 0.
std::atomic<int> g_writer_count{0};

}  // namespace

uint32_t masked_crc32c(std::string_view data) {
  Crc32c crc;
  crc.process_bytes(data.data(), data.size());
  const uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view payload) {
  std::string out;
  out.reserve(payload.size() + 16);
  put_le(out, payload.size(), 8);
  put_le(out, masked_crc32c(out), 4);
  out.append(payload);
  put_le(out, masked_crc32c(payload), 4);
  return out;
}

std::string tensorboard_tag(const std::string& key) {
  if (key.rfind("eval_", 0) == 0) return "eval/" + key.substr(5);
  if (key.rfind("test_", 0) == 0) return "test/" + key.substr(5);
  return "train/" + key;
}

fs::path default_tensorboard_subdir() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%b%d_%H-%M-%S", &tm);
  return fs::path("runs") / (std::string(buf) + "_" + host_name());
}

struct TensorBoardWriter::Impl {
  fs::path path;
  int fd = -1;
  std::set<std::string> tags_with_metadata;

  ~Impl() {
    if (fd >= 0) ::close(fd);
  }
  // The records of one call in one write: a killed process leaves whole records (and the reader
  // stops cleanly at a torn one).
  void write_events(const std::vector<tb::Event>& events) {
    std::string buf;
    for (const auto& e : events) buf += tfrecord(serialize(e));
    size_t done = 0;
    while (done < buf.size()) {
      const ssize_t n = ::write(fd, buf.data() + done, buf.size() - done);
      if (n < 0 && errno == EINTR) continue;
      ALPACA_CHECK(n > 0, "cannot write the TensorBoard event file " << path.string() << ": " << std::strerror(errno)
                                                                     << " (disk full?); free space or pass --report_to jsonl");
      done += static_cast<size_t>(n);
    }
  }
};

TensorBoardWriter::TensorBoardWriter() = default;
TensorBoardWriter::~TensorBoardWriter() = default;
TensorBoardWriter::TensorBoardWriter(TensorBoardWriter&&) noexcept = default;
TensorBoardWriter& TensorBoardWriter::operator=(TensorBoardWriter&&) noexcept = default;

TensorBoardWriter::TensorBoardWriter(const fs::path& log_dir, const std::string& flag) : impl_(std::make_unique<Impl>()) {
  std::error_code ec;
  fs::create_directories(log_dir, ec);
  ALPACA_CHECK(!ec, "cannot create the TensorBoard directory " << log_dir.string() << " (" << flag << "): " << ec.message()
                                                               << "; choose a writable " << flag);
  const double t = now_seconds();
  const std::string name = "events.out.tfevents." + std::to_string(static_cast<int64_t>(t)) + "." + host_name() + "." +
                           std::to_string(::getpid()) + "." + std::to_string(g_writer_count++);
  impl_->path = log_dir / name;
  impl_->fd = ::open(impl_->path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  ALPACA_CHECK(impl_->fd >= 0, "cannot create the TensorBoard event file " << impl_->path.string() << ": "
                                                                           << std::strerror(errno) << "; choose a writable "
                                                                           << flag);
  tb::Event e;
  e.set_wall_time(t);
  e.set_step(0);
  e.set_file_version("brain.Event:2");
  impl_->write_events({e});
}

const fs::path& TensorBoardWriter::path() const {
  static const fs::path kNone;
  return impl_ ? impl_->path : kNone;
}

void TensorBoardWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  if (!impl_) return;
  const double t = now_seconds();
  std::vector<tb::Event> events;
  events.reserve(values.size());
  for (const auto& [tag, value] : values) {
    tb::Event e;
    e.set_wall_time(t);
    e.set_step(step);
    tb::Summary::Value* v = e.mutable_summary()->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
    if (impl_->tags_with_metadata.insert(tag).second) {
      // TensorBoard keeps the first metadata it sees per tag; the scalars plugin has an empty
      // ScalarPluginData (version 0).
      tb::SummaryMetadata* m = v->mutable_metadata();
      m->mutable_plugin_data()->set_plugin_name("scalars");
      m->set_data_class(tb::DATA_CLASS_SCALAR);
    }
    events.push_back(std::move(e));
  }
  impl_->write_events(events);
}

void TensorBoardWriter::add_text(const std::string& tag, const std::string& text, int64_t step) {
  if (!impl_) return;
  tb::Event e;
  e.set_wall_time(now_seconds());
  e.set_step(step);
  tb::Summary::Value* v = e.mutable_summary()->add_value();
  v->set_tag(tag + "/text_summary");
  // TextPluginData{version = 0} serializes to no bytes.
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  tb::TensorProto* tensor = v->mutable_tensor();
  tensor->set_dtype(tb::DT_STRING);
  tensor->mutable_tensor_shape()->add_dim()->set_size(1);
  tensor->add_string_val(text);
  impl_->write_events({e});
}

}  // namespace alpaca::train
