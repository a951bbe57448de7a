#include "server/wire_request.h"

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/dynamic_message.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace tandem::server {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::DescriptorProto;
using google::protobuf::FieldDescriptor;
using google::protobuf::FieldDescriptorProto;
using google::protobuf::FileDescriptor;
using google::protobuf::FileDescriptorProto;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Offset of the first byte of `s` that does not continue well-formed UTF-8
// (no overlong forms, no surrogates, nothing past U+10FFFF); -1 when it is.
int64_t InvalidUtf8At(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const int64_t n = static_cast<int64_t>(s.size());
  for (int64_t i = 0; i < n;) {
    const unsigned char c = p[i];
    int len;
    unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (i + len > n) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (int k = 2; k < len; ++k) {
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
    }
    i += len;
  }
  return -1;
}

// Bytes may not key a map, so map entries become plain messages (the same wire
// format as well).
void StringsToBytes(DescriptorProto* message) {
  message->mutable_options()->clear_map_entry();
  for (FieldDescriptorProto& field : *message->mutable_field()) {
    if (field.type() == FieldDescriptorProto::TYPE_STRING) {
      field.set_type(FieldDescriptorProto::TYPE_BYTES);
    }
  }
  for (DescriptorProto& nested : *message->mutable_nested_type()) StringsToBytes(&nested);
}

// Copies of the generated descriptors with every string field turned into
// bytes (the same wire format, no UTF-8 check), built on first use.
class LenientPool {
 public:
  static LenientPool& Get() {
    static LenientPool* pool = new LenientPool();
    return *pool;
  }

  // A new, empty message of the lenient copy of `type`.
  std::unique_ptr<Message> New(const Descriptor* type) {
    absl::MutexLock lock(&mu_);
    Add(type->file());
    const Descriptor* lenient = pool_.FindMessageTypeByName(type->full_name());
    if (lenient == nullptr) return nullptr;
    return std::unique_ptr<Message>(factory_.GetPrototype(lenient)->New());
  }

 private:
  void Add(const FileDescriptor* file) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!added_.insert(file->name()).second) return;
    for (int i = 0; i < file->dependency_count(); ++i) Add(file->dependency(i));
    FileDescriptorProto proto;
    file->CopyTo(&proto);
    for (DescriptorProto& message : *proto.mutable_message_type()) StringsToBytes(&message);
    if (pool_.BuildFile(proto) == nullptr) {
      std::fprintf(stderr, "tandemd: cannot build a lenient copy of %s\n", file->name().c_str());
    }
  }

  absl::Mutex mu_;
  google::protobuf::DescriptorPool pool_ ABSL_GUARDED_BY(mu_);
  google::protobuf::DynamicMessageFactory factory_{&pool_};
  std::set<std::string> added_ ABSL_GUARDED_BY(mu_);
};

std::optional<std::string> CheckString(const std::string& value, const std::string& path) {
  const int64_t at = InvalidUtf8At(value);
  if (at < 0) return std::nullopt;
  return absl::StrFormat("%s: is not valid UTF-8 (byte 0x%02x at offset %d)", path,
                         static_cast<unsigned char>(value[at]), at);
}

std::optional<std::string> FindIn(const Message& lenient, const Descriptor* original,
                                  const std::string& prefix);

// One field of `lenient` (a message read with bytes for strings) whose
// original is `field`.
std::optional<std::string> CheckField(const Message& lenient, const FieldDescriptor* lenient_field,
                                      const FieldDescriptor* field, const std::string& path) {
  const Reflection* r = lenient.GetReflection();
  if (field->is_map()) {
    const FieldDescriptor* key = field->message_type()->map_key();
    const FieldDescriptor* value = field->message_type()->map_value();
    for (int i = 0; i < r->FieldSize(lenient, lenient_field); ++i) {
      const Message& entry = r->GetRepeatedMessage(lenient, lenient_field, i);
      const Reflection* er = entry.GetReflection();
      const Descriptor* ed = entry.GetDescriptor();
      const FieldDescriptor* lenient_key = ed->FindFieldByNumber(key->number());
      const FieldDescriptor* lenient_value = ed->FindFieldByNumber(value->number());
      std::string key_text;
      if (key->type() == FieldDescriptor::TYPE_STRING) {
        key_text = er->GetString(entry, lenient_key);
        if (auto bad = CheckString(key_text, absl::StrCat(path, " (a key)"))) return bad;
        key_text = absl::StrCat("\"", key_text, "\"");
      } else {
        key_text = "?";
      }
      const std::string entry_path = absl::StrCat(path, "[", key_text, "]");
      if (value->type() == FieldDescriptor::TYPE_STRING) {
        if (auto bad = CheckString(er->GetString(entry, lenient_value), entry_path)) return bad;
      } else if (value->type() == FieldDescriptor::TYPE_MESSAGE &&
                 er->HasField(entry, lenient_value)) {
        if (auto bad = FindIn(er->GetMessage(entry, lenient_value), value->message_type(),
                              entry_path + ".")) {
          return bad;
        }
      }
    }
    return std::nullopt;
  }
  const bool is_string = field->type() == FieldDescriptor::TYPE_STRING;
  const bool is_message = field->type() == FieldDescriptor::TYPE_MESSAGE;
  if (!is_string && !is_message) return std::nullopt;
  if (field->is_repeated()) {
    for (int i = 0; i < r->FieldSize(lenient, lenient_field); ++i) {
      const std::string item = absl::StrCat(path, "[", i, "]");
      std::optional<std::string> bad =
          is_string ? CheckString(r->GetRepeatedString(lenient, lenient_field, i), item)
                    : FindIn(r->GetRepeatedMessage(lenient, lenient_field, i),
                             field->message_type(), item + ".");
      if (bad) return bad;
    }
    return std::nullopt;
  }
  return is_string
             ? CheckString(r->GetString(lenient, lenient_field), path)
             : FindIn(r->GetMessage(lenient, lenient_field), field->message_type(), path + ".");
}

std::optional<std::string> FindIn(const Message& lenient, const Descriptor* original,
                                  const std::string& prefix) {
  std::vector<const FieldDescriptor*> fields;
  lenient.GetReflection()->ListFields(lenient, &fields);
  for (const FieldDescriptor* lenient_field : fields) {
    const FieldDescriptor* field = original->FindFieldByNumber(lenient_field->number());
    if (field == nullptr) continue;
    if (auto bad = CheckField(lenient, lenient_field, field, prefix + field->name())) return bad;
  }
  return std::nullopt;
}

// The path of the first string field of `bytes`, read as a `type`, that is not
// UTF-8, and why; nullopt when there is none or the bytes are not such a
// message even with strings read as bytes.
std::optional<std::string> FindInvalidUtf8(const Descriptor* type, const std::string& bytes) {
  std::unique_ptr<Message> lenient = LenientPool::Get().New(type);
  if (lenient == nullptr || !lenient->ParseFromString(bytes)) return std::nullopt;
  return FindIn(*lenient, type, "");
}

}  // namespace

grpc::Status ParseRequest(const grpc::ByteBuffer& raw, Message* out) {
  {
    // Read in place from the request's slices (the copy shares them).
    grpc::ByteBuffer view(raw);
    grpc::ProtoBufferReader reader(&view);
    // Protobuf logs every string that is not UTF-8; a client could fill the
    // daemon's log with them. The status says it instead.
    google::protobuf::LogSilencer quiet;
    if (out->ParseFromZeroCopyStream(&reader)) return grpc::Status::OK;
  }
  // It does not parse: read its bytes again to say why.
  const Descriptor* type = out->GetDescriptor();
  out->Clear();
  std::vector<grpc::Slice> slices;
  if (!raw.Dump(&slices).ok()) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "the request could not be read");
  }
  std::string bytes;
  bytes.reserve(raw.Length());
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  if (std::optional<std::string> bad = FindInvalidUtf8(type, bytes)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, *bad);
  }
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      absl::StrCat("the request is not a valid ", type->full_name(), " message (",
                                   bytes.size(), " bytes)"));
}

void SerializeResponse(const Message& message, grpc::ByteBuffer* raw) {
  // Straight into gRPC's slices, as generated services do (no string copy).
  // The writer needs an empty buffer, and `raw` may hold the previous message
  // of a stream.
  grpc::ByteBuffer fresh;
  bool own_buffer = false;
  grpc::SerializationTraits<Message>::Serialize(message, &fresh, &own_buffer).IgnoreError();
  raw->Swap(&fresh);
}

}  // namespace tandem::server
