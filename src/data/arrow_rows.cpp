// Parquet, Arrow IPC and CSV dataset files -> rows of JSON, through the Arrow C++ library of the
// pyarrow wheel (the only file that includes Arrow: its headers are heavy, and this keeps them out
// of every other translation unit). A cell becomes the JSON the same value has in a JSON dataset:
// strings, bools, integers, floats, lists, structs (objects), maps with string keys (objects),
// dictionary-encoded values; null object members are left out (see dataset_rows.h). Any other
// Arrow type (binary, timestamps, ...) is an error naming the file, row and column.
#include <arrow/api.h>                // defines: arrow::Array and its subclasses, Table, Status
#include <arrow/csv/api.h>            // defines: arrow::csv::TableReader, StreamingReader and their options
#include <arrow/io/file.h>            // defines: arrow::io::ReadableFile
#include <arrow/ipc/reader.h>         // defines: RecordBatchStreamReader, RecordBatchFileReader
#include <parquet/arrow/reader.h>     // defines: parquet::arrow::OpenFile, FileReader
#include <parquet/exception.h>        // defines: parquet::ParquetException

#include "alpaca/util/error.h"
#include "dataset_rows.h"

namespace alpaca::data {
namespace {

// Where a cell is, for errors.
struct Where {
  const std::string& path;
  int64_t row;
  const std::string& column;
};

template <class T>
T ok_or_fail(arrow::Result<T> r, const std::string& path, const char* what) {
  ALPACA_CHECK(r.ok(), path << ": " << what << ": " << r.status().ToString());
  return std::move(r).ValueUnsafe();
}

Row cell(const arrow::Array& a, int64_t i, const Where& w);

Row list_cell(const std::shared_ptr<arrow::Array>& values, const Where& w) {
  Row out = Row::array();
  for (int64_t k = 0; k < values->length(); ++k) out.push_back(cell(*values, k, w));
  return out;
}

Row struct_cell(const arrow::StructArray& s, int64_t i, const Where& w) {
  Row out = Row::object();
  const auto& type = static_cast<const arrow::StructType&>(*s.type());
  for (int f = 0; f < s.num_fields(); ++f) {
    const auto field = s.field(f);  // sliced to the struct's offset
    if (field->IsNull(i)) continue;
    out[type.field(f)->name()] = cell(*field, i, w);
  }
  return out;
}

Row map_cell(const arrow::MapArray& m, int64_t i, const Where& w) {
  Row out = Row::object();
  for (int64_t k = m.value_offset(i); k < m.value_offset(i) + m.value_length(i); ++k) {
    const Row key = cell(*m.keys(), k, w);
    ALPACA_CHECK(key.is_string(), w.path << ": row " << w.row << ", column \"" << w.column
                                         << "\": a map with non-string keys has no JSON form");
    if (!m.items()->IsNull(k)) out[key.get<std::string>()] = cell(*m.items(), k, w);
  }
  return out;
}

template <class A>
Row number(const arrow::Array& a, int64_t i) {
  return Row(static_cast<const A&>(a).Value(i));
}

Row cell(const arrow::Array& a, int64_t i, const Where& w) {
  if (a.IsNull(i)) return Row();
  using T = arrow::Type;
  switch (a.type_id()) {
    case T::NA: return Row();
    case T::BOOL: return Row(static_cast<const arrow::BooleanArray&>(a).Value(i));
    case T::INT8: return number<arrow::Int8Array>(a, i);
    case T::INT16: return number<arrow::Int16Array>(a, i);
    case T::INT32: return number<arrow::Int32Array>(a, i);
    case T::INT64: return number<arrow::Int64Array>(a, i);
    case T::UINT8: return number<arrow::UInt8Array>(a, i);
    case T::UINT16: return number<arrow::UInt16Array>(a, i);
    case T::UINT32: return number<arrow::UInt32Array>(a, i);
    case T::UINT64: return number<arrow::UInt64Array>(a, i);
    case T::FLOAT: return number<arrow::FloatArray>(a, i);
    case T::DOUBLE: return number<arrow::DoubleArray>(a, i);
    case T::STRING: return Row(static_cast<const arrow::StringArray&>(a).GetString(i));
    case T::LARGE_STRING: return Row(static_cast<const arrow::LargeStringArray&>(a).GetString(i));
    case T::STRING_VIEW: return Row(static_cast<const arrow::StringViewArray&>(a).GetString(i));
    case T::LIST: return list_cell(static_cast<const arrow::ListArray&>(a).value_slice(i), w);
    case T::LARGE_LIST: return list_cell(static_cast<const arrow::LargeListArray&>(a).value_slice(i), w);
    case T::FIXED_SIZE_LIST:
      return list_cell(static_cast<const arrow::FixedSizeListArray&>(a).value_slice(i), w);
    case T::STRUCT: return struct_cell(static_cast<const arrow::StructArray&>(a), i, w);
    case T::MAP: return map_cell(static_cast<const arrow::MapArray&>(a), i, w);
    case T::DICTIONARY: {
      const auto& d = static_cast<const arrow::DictionaryArray&>(a);
      return cell(*d.dictionary(), d.GetValueIndex(i), w);
    }
    default:
      ALPACA_FAIL(w.path << ": row " << w.row << ", column \"" << w.column << "\" holds Arrow type "
                         << a.type()->ToString()
                         << ", which has no JSON form here (strings, numbers, bools, lists and structs do)");
  }
}

void append_batch(const arrow::RecordBatch& batch, const std::string& path, std::vector<Row>& rows) {
  const auto& schema = *batch.schema();
  for (int64_t r = 0; r < batch.num_rows(); ++r) {
    Row row = Row::object();
    const int64_t index = static_cast<int64_t>(rows.size());
    for (int c = 0; c < batch.num_columns(); ++c) {
      const auto& col = *batch.column(c);
      if (col.IsNull(r)) continue;
      row[schema.field(c)->name()] = cell(col, r, Where{path, index, schema.field(c)->name()});
    }
    rows.push_back(std::move(row));
  }
}

std::vector<Row> stream_rows(const std::shared_ptr<arrow::io::ReadableFile>& file, const std::string& path) {
  auto reader = ok_or_fail(arrow::ipc::RecordBatchStreamReader::Open(file), path,
                           "not a readable Arrow IPC stream");
  std::vector<Row> rows;
  for (;;) {
    std::shared_ptr<arrow::RecordBatch> batch;
    auto st = reader->ReadNext(&batch);
    ALPACA_CHECK(st.ok(), path << ": corrupt Arrow IPC stream: " << st.ToString());
    if (!batch) break;
    append_batch(*batch, path, rows);
  }
  return rows;
}

// Every row of a table read whole (Parquet, CSV), a record batch at a time.
std::vector<Row> table_rows(const arrow::Table& table, const std::string& path) {
  arrow::TableBatchReader batches(table);
  std::vector<Row> rows;
  for (;;) {
    std::shared_ptr<arrow::RecordBatch> batch;
    auto st = batches.ReadNext(&batch);
    ALPACA_CHECK(st.ok(), path << ": " << st.ToString());
    if (!batch) break;
    append_batch(*batch, path, rows);
  }
  return rows;
}

}  // namespace

std::vector<Row> read_arrow_rows(const std::string& path) {
  auto file = ok_or_fail(arrow::io::ReadableFile::Open(path), path, "cannot open");
  // The IPC file format starts with "ARROW1"; save_to_disk writes the stream format.
  auto head = ok_or_fail(file->ReadAt(0, 6), path, "cannot read");
  auto st = file->Seek(0);
  ALPACA_CHECK(st.ok(), path << ": cannot seek: " << st.ToString());
  if (head->ToString() != "ARROW1") return stream_rows(file, path);
  auto reader = ok_or_fail(arrow::ipc::RecordBatchFileReader::Open(file), path,
                           "not a readable Arrow IPC file");
  std::vector<Row> rows;
  for (int b = 0; b < reader->num_record_batches(); ++b)
    append_batch(*ok_or_fail(reader->ReadRecordBatch(b), path, "corrupt Arrow IPC file"), path, rows);
  return rows;
}

std::vector<Row> read_parquet_rows(const std::string& path) {
  auto file = ok_or_fail(arrow::io::ReadableFile::Open(path), path, "cannot open");
  std::shared_ptr<arrow::Table> table;
  try {
    auto reader = ok_or_fail(parquet::arrow::OpenFile(file, arrow::default_memory_pool()), path,
                             "not a readable Parquet file");
    table = ok_or_fail(reader->ReadTable(), path, "corrupt Parquet file");
  } catch (const parquet::ParquetException& e) {
    ALPACA_FAIL(path << ": not a readable Parquet file: " << e.what());
  }
  return table_rows(*table, path);
}

// Arrow's CSV reader splitting as pandas.read_csv does by default: a header row, double quotes (a
// quote inside a quoted field doubled), newlines inside quoted fields, blank lines skipped. Every
// column is read as text, no cell as null (dataset_rows.h): the names come from a first look at the
// file (the schema of its first block), then each is read as utf8.
std::vector<Row> read_csv_rows(const std::string& path) {
  auto read = arrow::csv::ReadOptions::Defaults();
  auto parse = arrow::csv::ParseOptions::Defaults();
  parse.newlines_in_values = true;
  auto convert = arrow::csv::ConvertOptions::Defaults();
  convert.strings_can_be_null = false;  // utf8 columns: every cell text, "" when empty
  const auto io = arrow::io::default_io_context();
  {
    auto file = ok_or_fail(arrow::io::ReadableFile::Open(path), path, "cannot open");
    auto first = ok_or_fail(arrow::csv::StreamingReader::Make(io, file, read, parse, convert), path, "not a readable CSV file");
    for (const auto& name : first->schema()->field_names()) convert.column_types[name] = arrow::utf8();
  }
  auto file = ok_or_fail(arrow::io::ReadableFile::Open(path), path, "cannot open");
  auto reader = ok_or_fail(arrow::csv::TableReader::Make(io, file, read, parse, convert), path, "not a readable CSV file");
  const std::shared_ptr<arrow::Table> table = ok_or_fail(reader->Read(), path, "not a readable CSV file");
  return table_rows(*table, path);
}

}  // namespace alpaca::data
