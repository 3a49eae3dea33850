// Debian's ONNX protobuf classes (onnx::ModelProto, ...), with the namespace and ONNX-ML
// messages it was generated with: the torch wheel's targets define ONNX_NAMESPACE=onnx_torch
// for the copy inside libtorch, and the library is linked without its compile definitions.
#pragma once

#undef ONNX_NAMESPACE
#define ONNX_NAMESPACE onnx
#ifndef ONNX_ML
#define ONNX_ML 1
#endif
#include <onnx/onnx_pb.h>
