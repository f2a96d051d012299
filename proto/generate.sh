#!/bin/sh
# Regenerate the committed protobuf/gRPC modules after editing cluster.proto.
set -e
cd "$(dirname "$0")/.."
python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. proto/cluster.proto
