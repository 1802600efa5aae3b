// --data_path -> Dataset: the comma-separated paths, each file's kind (by extension, checked
// against its first bytes), its rows, its format, and the normalised rows in order.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "alpaca/data/conversation.h"
#include "alpaca/tokenizer/tokenizer.h"
#include "alpaca/util/error.h"
#include "alpaca/util/user_error.h"
#include "alpaca/util/file.h"
#include "conversation_rows.h"

namespace alpaca::data {
namespace {

namespace fs = std::filesystem;

std::string read_file(const std::string& path) {
  const std::optional<std::string> text = util::read_file(path);
  ALPACA_CHECK(text, "cannot open dataset " << path << "; check --data_path");
  return *text;
}

std::string head_bytes(const std::string& path, size_t n) {
  std::ifstream in(path, std::ios::binary);
  std::string s(n, '\0');
  in.read(s.data(), static_cast<std::streamsize>(n));
  s.resize(static_cast<size_t>(std::max<std::streamsize>(in.gcount(), 0)));
  return s;
}

bool is_parquet_bytes(const std::string& head) { return head.rfind("PAR1", 0) == 0; }
// Arrow IPC file ("ARROW1") or stream (a 0xFFFFFFFF continuation marker, or a pre-0.15 message
// length; save_to_disk writes the stream with the marker).
bool is_arrow_bytes(const std::string& head) {
  return head.rfind("ARROW1", 0) == 0 || head.rfind(std::string(4, '\xFF'), 0) == 0;
}

std::string lower_ext(const fs::path& p) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return std::tolower(c); });
  return e;
}

// The data-*.arrow files of a save_to_disk directory, in state.json's order when it lists them
// (`_data_files`), else by name (data-00000-of-00002.arrow, ...).
std::vector<std::string> save_to_disk_files(const fs::path& dir) {
  // A DatasetDict saved with save_to_disk: one save_to_disk directory per split, named in dataset_dict.json.
  if (fs::is_regular_file(dir / "dataset_dict.json") && !fs::is_regular_file(dir / "state.json")) {
    std::vector<std::string> splits;
    try {
      const Row d = Row::parse(read_file((dir / "dataset_dict.json").string()));
      if (d.is_object() && d.contains("splits") && d["splits"].is_array())
        for (const Row& sp : d["splits"])
          if (sp.is_string()) splits.push_back(sp.get<std::string>());
    } catch (const Row::exception&) {
    }
    std::string names, pick = splits.empty() ? "<split>" : splits.front();
    for (const auto& sp : splits) {
      names += (names.empty() ? "" : ", ") + sp;
      if (sp == "train") pick = sp;
    }
    ALPACA_USER_FAIL(dir.string() << " is a datasets DatasetDict (save_to_disk of several splits"
                                  << (names.empty() ? "" : ": " + names) << "); give one split's directory, e.g. "
                                  << (dir / pick).string());
  }
  ALPACA_CHECK(fs::is_regular_file(dir / "dataset_info.json") || fs::is_regular_file(dir / "state.json"),
               dir.string() << " is a directory without dataset_info.json or state.json, so not a "
                               "datasets.save_to_disk directory; give a data file or such a directory");
  std::vector<std::string> files;
  if (fs::is_regular_file(dir / "state.json")) {
    Row state;
    try {
      state = Row::parse(read_file((dir / "state.json").string()));
    } catch (const Row::exception& e) {
      ALPACA_FAIL((dir / "state.json").string() << " is not valid JSON (" << e.what() << ")");
    }
    if (state.is_object() && state.contains("_data_files") && state["_data_files"].is_array())
      for (const Row& f : state["_data_files"])
        if (f.is_object() && f.contains("filename") && f["filename"].is_string())
          files.push_back((dir / f["filename"].get<std::string>()).string());
  }
  if (files.empty()) {
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("data-", 0) == 0 && lower_ext(e.path()) == ".arrow") files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
  }
  ALPACA_CHECK(!files.empty(), dir.string() << " (a save_to_disk directory) has no data-*.arrow files");
  return files;
}

// Calls on_row for every row of one file (not a directory), checking the extension's promise.
void file_rows(const std::string& path, const std::function<void(Row&&, int64_t)>& on_row) {
  const std::string ext = lower_ext(path);
  const std::string head = head_bytes(path, 8);
  if (ext == ".parquet") {
    ALPACA_CHECK(is_parquet_bytes(head), path << " is named .parquet but is not a Parquet file (it does not start "
                                              "with PAR1); convert it or give it its real extension");
  } else if (ext == ".arrow") {
    ALPACA_CHECK(is_arrow_bytes(head), path << " is named .arrow but is not an Arrow IPC file or stream; "
                                            "convert it or give it its real extension");
  } else if (ext == ".csv") {
    ALPACA_CHECK(!is_parquet_bytes(head) && !is_arrow_bytes(head),
                 path << " is a " << (is_parquet_bytes(head) ? "Parquet" : "Arrow")
                      << " file but its name says CSV; rename it to ." << (is_parquet_bytes(head) ? "parquet" : "arrow"));
  } else {
    // .json, .jsonl and any other name: JSON (as --data_path always read), unless the bytes say
    // it is a binary format the name hides.
    ALPACA_CHECK(!is_parquet_bytes(head) && !is_arrow_bytes(head),
                 path << " is a " << (is_parquet_bytes(head) ? "Parquet" : "Arrow")
                      << " file but its name says JSON; rename it to ."
                      << (is_parquet_bytes(head) ? "parquet" : "arrow"));
    for_each_json_row(read_file(path), path, on_row);
    return;
  }
  std::vector<Row> rows = ext == ".parquet" ? read_parquet_rows(path) : ext == ".csv" ? read_csv_rows(path) : read_arrow_rows(path);
  ALPACA_CHECK(!rows.empty(), path << ": the dataset has no records");
  for (size_t i = 0; i < rows.size(); ++i) on_row(std::move(rows[i]), static_cast<int64_t>(i));
}

// The rows of one --data_path item, normalised; returns the format used.
DatasetFormat load_one(const std::string& path, const RowFormat& requested, std::vector<ConversationRow>& out) {
  ALPACA_CHECK(fs::exists(path), "--data_path " << path << ": no such file or directory");
  RowFormat format = requested;
  const size_t first = out.size();
  auto on_row = [&](Row&& row, int64_t index) {
    if (format.format == DatasetFormat::kAuto) format.format = detect_format(row, path, format.text_field);
    out.push_back(normalise_row(row, format, path, index));
  };
  if (fs::is_directory(path)) {
    // One dataset split over several arrow files: its rows are numbered across them.
    int64_t base = 0;
    for (const std::string& f : save_to_disk_files(path)) {
      int64_t n = 0;
      file_rows(f, [&](Row&& row, int64_t i) {
        on_row(std::move(row), base + i);
        n = i + 1;
      });
      base += n;
    }
  } else {
    file_rows(path, on_row);
  }
  settle_tokenized_columns(out, first);
  return format.format;
}

}  // namespace

std::vector<std::string> split_data_paths(const std::string& paths) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(paths);
  while (std::getline(in, item, ',')) {
    const size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    ALPACA_CHECK(a != std::string::npos, "--data_path \"" << paths << "\" has an empty item; separate files with "
                                                              "single commas");
    out.push_back(item.substr(a, b - a + 1));
  }
  ALPACA_CHECK(!out.empty(), "--data_path is empty; give a dataset file");
  return out;
}

Dataset load_dataset(const std::string& paths, const RowFormat& format) {
  Dataset d;
  try {
    for (const std::string& p : split_data_paths(paths)) d.files.emplace_back(p, load_one(p, format, d.rows));
  } catch (const UserError&) {
    throw;
  } catch (const Error& e) {
    // Whatever is wrong here is in the user's files, and every rank reads the same ones: a user
    // error, printed once with its message (which names the file and row), no source location.
    ALPACA_USER_FAIL(e.message());
  }
  return d;
}

bool Dataset::all_alpaca() const {
  return std::all_of(rows.begin(), rows.end(),
                     [](const ConversationRow& r) { return r.format == DatasetFormat::kAlpaca; });
}

std::vector<AlpacaRecord> Dataset::alpaca_records() const {
  ALPACA_CHECK(all_alpaca(), "alpaca_records() on a dataset with conversation rows");
  std::vector<AlpacaRecord> out;
  out.reserve(rows.size());
  for (const auto& r : rows) out.push_back(r.alpaca);
  return out;
}

FileFormats peek_dataset_formats(const std::string& paths, const RowFormat& format) {
  struct Stop {};  // thrown after the first row: the rest need not be normalised
  FileFormats out;
  for (const std::string& p : split_data_paths(paths)) {
    DatasetFormat found = format.format;
    if (format.format == DatasetFormat::kAuto) {
      try {
        const std::string file = fs::is_directory(p) ? save_to_disk_files(p).front() : p;
        file_rows(file, [&](Row&& row, int64_t) {
          found = detect_format(row, p, format.text_field);
          throw Stop{};
        });
      } catch (const Stop&) {
      } catch (const Error&) {
        found = DatasetFormat::kAuto;
      }
    }
    out.emplace_back(p, found);
  }
  return out;
}

SpecialTokens prepare_special_tokens(tokenizer::Tokenizer& tok, const std::string& paths, const std::string& eval_paths,
                                     const RowFormat& format, const std::string& eos_token, const std::string& pad_token) {
  for (const auto& [flag, token] : {std::pair{"--eos_token", &eos_token}, {"--pad_token", &pad_token}})
    ALPACA_USER_CHECK(token->empty() || tok.token_to_id(*token),
                      flag << " '" << *token << "' is not in the vocabulary of " << tok.source()
                           << " (TRL refuses it too); give a token the tokenizer has");
  if (!eos_token.empty()) tok.set_eos_token(eos_token);
  if (!pad_token.empty()) tok.set_pad_token(pad_token);
  SpecialTokens out;
  out.train_py = follows_train_py_tokens(paths, eval_paths, format);
  out.num_new_tokens = out.train_py ? tok.add_missing_special_tokens() : tok.use_eos_as_missing_pad();
  return out;
}

bool follows_train_py_tokens(const std::string& paths, const std::string& eval_paths, const RowFormat& format) {
  for (const std::string* list : {&paths, &eval_paths}) {
    if (list->empty()) continue;
    for (const auto& [path, found] : peek_dataset_formats(*list, format))
      if (found == DatasetFormat::kAlpaca || found == DatasetFormat::kAuto) return true;
  }
  return false;
}

}  // namespace alpaca::data
