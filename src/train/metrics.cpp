#include "alpaca/train/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <nlohmann/json.hpp>  // defines: nlohmann::json
#include <sstream>

#include "alpaca/ckpt/checkpoint_dir.h"
#include "alpaca/util/error.h"

namespace alpaca::train {
namespace {

nlohmann::json to_json(const LogEntry& entry) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : entry) {
    if (std::holds_alternative<int64_t>(v)) j[k] = std::get<int64_t>(v);
    else if (std::isfinite(std::get<double>(v))) j[k] = std::get<double>(v);
    else j[k] = nullptr;  // JSON has no NaN/Inf; null says "not a number" without breaking readers
  }
  return j;
}

// Python's repr of a float: the shortest digits that round-trip, written in positional notation
// when the decimal exponent is in [-4, 16) (12270.0, 0.0001), else as 1.5e+16 / 1e-05 (float_repr_style
// 'short'). %g would switch to an exponent as soon as it passes the digit count (1.227e+04).
std::string py_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[40];
  int prec = 1;
  for (; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof(buf), "%.*e", prec - 1, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  const std::string e_form = buf;  // [-]d[.ddd]e[+-]XX
  const size_t e_at = e_form.find('e');
  const int exp10 = std::atoi(e_form.c_str() + e_at + 1);
  if (exp10 >= -4 && exp10 < 16) {
    std::snprintf(buf, sizeof(buf), "%.*f", std::max(0, prec - 1 - exp10), x);
    std::string s = buf;
    if (s.find('.') == std::string::npos) s += ".0";
    return s;
  }
  const std::string mantissa = e_form.substr(0, e_at);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
  return mantissa + exp_buf;
}

}  // namespace

double LossAccumulator::take_log_average(int64_t global_step) {
  ALPACA_CHECK(global_step > last_logged_step_, "logging step " << global_step << " is not after the last logged step "
                                                                << last_logged_step_);
  const double avg = since_log_ / static_cast<double>(global_step - last_logged_step_);
  total_logged_ += since_log_;
  since_log_ = 0;
  last_logged_step_ = global_step;
  return avg;
}

double LossAccumulator::train_loss(int64_t global_step, int64_t initial_step) const {
  const double steps = std::max<double>(static_cast<double>(global_step - initial_step), 0.001);
  return (total_logged_ + since_log_) / steps;
}

double round_to(double x, int ndigits) {
  // Python rounds the exact binary value; going through the shortest decimal is equivalent for the
  // 3-4 digit rounding HF does on timings.
  const double scale = std::pow(10.0, ndigits);
  return std::nearbyint(x * scale) / scale;
}

LogEntry speed_metrics(const std::string& split, double runtime_s, std::optional<double> num_samples,
                       std::optional<int64_t> num_steps) {
  LogEntry e = {{split + "_runtime", round_to(runtime_s, 4)}};
  if (runtime_s == 0) return e;
  if (num_samples) e.emplace_back(split + "_samples_per_second", round_to(*num_samples / runtime_s, 3));
  if (num_steps) e.emplace_back(split + "_steps_per_second", round_to(static_cast<double>(*num_steps) / runtime_s, 3));
  return e;
}

void save_metrics(const std::filesystem::path& output_dir, const std::string& split, const LogEntry& metrics,
                  bool combined) {
  std::filesystem::create_directories(output_dir);
  const nlohmann::json j = to_json(metrics);
  ckpt::write_file_durable(output_dir / (split + "_results.json"), j.dump(4));
  if (!combined) return;
  const auto all_path = output_dir / "all_results.json";
  nlohmann::json all = nlohmann::json::object();
  if (std::filesystem::exists(all_path)) {
    std::ifstream f(all_path);
    try {
      all = nlohmann::json::parse(f);
    } catch (const std::exception& e) {
      ALPACA_FAIL(all_path.string() << " is not valid JSON (" << e.what() << "); delete it or choose another --output_dir");
    }
  }
  all.update(j);
  ckpt::write_file_durable(all_path, all.dump(4));
}

ReportTo parse_report_to(const std::vector<std::string>& words) {
  ReportTo r;
  for (const std::string& w : words) {
    if (w == "none" || w.empty()) continue;
    if (w == "jsonl" || w == "all") r.jsonl = true;
    if (w == "tensorboard" || w == "all") r.tensorboard = true;
    if (w == "jsonl" || w == "tensorboard" || w == "all") continue;
    ALPACA_FAIL("--report_to " << w << " is not supported by alpaca-train (no " << w
                               << " integration in C++); use --report_to jsonl (output_dir/metrics.jsonl), tensorboard "
                                  "(event files in logging_dir), all (both) or none");
  }
  return r;
}

MetricsJsonl::MetricsJsonl(const std::filesystem::path& output_dir, bool append) {
  std::filesystem::create_directories(output_dir);
  const auto path = output_dir / "metrics.jsonl";
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  ALPACA_CHECK(out_.is_open(), "cannot open " << path << " for writing; check --output_dir permissions");
}

std::string MetricsJsonl::to_json_line(const LogEntry& entry) { return to_json(entry).dump(); }

void MetricsJsonl::write(const LogEntry& entry) {
  if (!out_.is_open()) return;
  out_ << to_json_line(entry) << '\n';
  out_.flush();
}

std::string format_log_line(const LogEntry& entry) {
  std::ostringstream os;
  os << '{';
  bool first = true;
  for (const auto& [k, v] : entry) {
    os << (first ? "" : ", ") << '\'' << k << "': ";
    if (std::holds_alternative<int64_t>(v)) os << std::get<int64_t>(v);
    else os << py_float(std::get<double>(v));
    first = false;
  }
  os << '}';
  return os.str();
}

}  // namespace alpaca::train
