// Requests the service parses itself (the raw callback methods of
// tandem.v1.Tandem), so that one that does not parse gets INVALID_ARGUMENT
// naming what is wrong. gRPC's generated handlers answer a request that fails
// to parse (a string field that is not UTF-8, say) with UNIMPLEMENTED and no
// message at all.
#ifndef TANDEM_SERVER_WIRE_REQUEST_H_
#define TANDEM_SERVER_WIRE_REQUEST_H_

#include "google/protobuf/message.h"
#include "grpcpp/grpcpp.h"

namespace tandem::server {

// Parses `raw` into `out`. When it does not parse: INVALID_ARGUMENT naming the
// first string field that is not UTF-8 by its path in the request
// ("spec.labels[\"team\"]: is not valid UTF-8 (byte 0xff at offset 2)"), or
// saying the bytes are not a message of that type at all.
grpc::Status ParseRequest(const grpc::ByteBuffer& raw, google::protobuf::Message* out);

// Serializes `message` into `raw`.
void SerializeResponse(const google::protobuf::Message& message, grpc::ByteBuffer* raw);

}  // namespace tandem::server

#endif  // TANDEM_SERVER_WIRE_REQUEST_H_
